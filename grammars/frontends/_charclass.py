"""What the hand-written front ends (regex, GBNF) share: a cursor with positioned errors,
numeric escapes, ``[...]`` class bodies and case folding.

Keeping these in one place means ``\\x41`` or ``[a-z]`` cannot mean slightly different things
in two dialects by accident; each dialect only supplies its own table of escapes.

Class escapes and case folding mean different things in Python's ``re`` and in ECMA-262; a class
is computed in each and the results intersected (``class_set``), so what we accept is accepted by
both. See ``grammars.frontends.regex`` for why.
"""

from __future__ import annotations

import array
import bisect
import functools
import re
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Union

from grammars.errors import GrammarSyntaxError, SourcePosition, UnsupportedGrammarError
from grammars.ir import MAX_CODE_POINT, Chars

__all__ = [
    "Cursor",
    "ClassItem",
    "read_hex_digits",
    "read_hex_escape",
    "check_code_point",
    "parse_class_body",
    "DialectChars",
    "class_set",
    "fold_case",
    "python_fold",
    "ecma_fold",
    "case_closure",
    "ANY_CHAR",
    "all_characters",
    "chars_where",
]

#: every Unicode scalar value (surrogates are cut out by ``Chars`` itself)
ANY_CHAR = Chars(((0, MAX_CODE_POINT),))


@dataclass(frozen=True)
class DialectChars:
    """A class escape such as ``\\d`` whose set differs between the two dialects we must satisfy:
    ``python`` is what Python's ``re`` matches (``str`` pattern, no flags; the validators' dialect),
    ``ecma`` what ECMA-262 matches (the JSON Schema spec's dialect)."""

    python: Chars
    ecma: Chars

    @classmethod
    def exact(cls, members: Chars) -> "DialectChars":
        return cls(members, members)

    def negated(self) -> "DialectChars":
        """``\\D`` from ``\\d``: complemented in each dialect separately."""
        return DialectChars(self.python.complement(), self.ecma.complement())


#: one member of a class as read by a dialect: a single code point, or a whole set (``\d``),
#: exact (``Chars``) or dialect-dependent (``DialectChars``)
ClassItem = Union[int, Chars, DialectChars]

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


class Cursor:
    """A read position in a source text that can build errors pointing at any offset in it."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.pos = 0

    def peek(self, ahead: int = 0) -> str:
        """The character ``ahead`` places on, or ``""`` past the end."""
        i = self.pos + ahead
        return self.text[i] if i < len(self.text) else ""

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def take(self) -> str:
        ch = self.peek()
        self.pos += 1
        return ch

    def take_if(self, expected: str) -> bool:
        if self.text.startswith(expected, self.pos):
            self.pos += len(expected)
            return True
        return False

    def error(self, message: str, offset: int | None = None) -> GrammarSyntaxError:
        offset = self.pos if offset is None else offset
        return GrammarSyntaxError(message, self.text, offset, source=self.source)

    def unsupported(self, construct: str, offset: int | None = None) -> UnsupportedGrammarError:
        """Fail closed on valid input we cannot enforce exactly, naming the construct and where it is."""
        offset = self.pos if offset is None else offset
        where = SourcePosition.at(self.text, offset)
        # Reuse GrammarSyntaxError's caret rendering so both error kinds look alike.
        context = GrammarSyntaxError("", self.text, offset, source=self.source).context()
        err = UnsupportedGrammarError(
            f"{self.source}:{where.line}:{where.column}: unsupported {construct} (offset {offset})\n{context}"
        )
        err.construct = construct  # type: ignore[attr-defined]
        err.offset = offset  # type: ignore[attr-defined]
        return err


def read_hex_digits(cur: Cursor, digits: int, start: int) -> int:
    """Exactly ``digits`` hex digits at the cursor, unchecked (``start``: the escape's backslash)."""
    text = cur.text[cur.pos : cur.pos + digits]
    if len(text) != digits or not all(c in _HEX_DIGITS for c in text):
        raise cur.error(f"expected {digits} hex digits in escape", start)
    cur.pos += digits
    return int(text, 16)


def read_hex_escape(cur: Cursor, digits: int, start: int) -> int:
    """``\\xHH``-style escape body: exactly ``digits`` hex digits naming a valid scalar value."""
    return check_code_point(cur, read_hex_digits(cur, digits, start), start)


def check_code_point(cur: Cursor, value: int, start: int) -> int:
    """Reject values with no UTF-8 encoding, so an escape never silently vanishes from a class."""
    if value > MAX_CODE_POINT:
        raise cur.error(f"code point U+{value:X} is beyond U+10FFFF", start)
    if 0xD800 <= value <= 0xDFFF:
        raise cur.error(f"surrogate code point U+{value:04X} has no UTF-8 encoding", start)
    return value


def parse_class_body(
    cur: Cursor,
    read_item: Callable[[Cursor], ClassItem],
    start: int,
    *,
    case_insensitive: bool = False,
) -> Chars:
    """The rest of a ``[...]`` class, the cursor just past ``[``; returns the (possibly negated) set.

    ``a-b`` is a range unless ``-`` is last; a set-valued item (``\\d``) as a range end fails closed
    because dialects disagree on it. How members combine (per dialect, then intersected so the
    result is within every dialect's set) is ``class_set``.
    """
    negated = cur.take_if("^")
    ranges: list[tuple[int, int]] = []
    sets: list[DialectChars] = []
    while cur.peek() != "]":
        if cur.at_end():
            raise cur.error("unterminated character class", start)
        item_start = cur.pos
        low = read_item(cur)
        if cur.peek() == "-" and cur.peek(1) not in ("]", ""):
            cur.take()
            high = read_item(cur)
            ranges.append(_range(cur, low, high, item_start))
        elif isinstance(low, (Chars, DialectChars)):
            sets.append(DialectChars.exact(low) if isinstance(low, Chars) else low)
        else:
            ranges.append((low, low))
    cur.take()
    return class_set(Chars(tuple(ranges)), tuple(sets), negated=negated, case_insensitive=case_insensitive)


def _range(cur: Cursor, low: ClassItem, high: ClassItem, start: int) -> tuple[int, int]:
    if not isinstance(low, int) or not isinstance(high, int):
        raise cur.unsupported("character-class escape as a range endpoint", start)
    if high < low:
        raise cur.error(f"bad character range {chr(low)!r}-{chr(high)!r}", start)
    return (low, high)


# --- sets whose meaning depends on the dialect -------------------------------------------


@functools.lru_cache(maxsize=1024)
def class_set(
    literals: Chars, sets: tuple[DialectChars, ...] = (), *, negated: bool = False, case_insensitive: bool = False
) -> Chars:
    """The characters a class ``[literals sets]`` (``[^...]`` when ``negated``) matches in BOTH dialects.

    Each dialect's own set is computed (or bounded from the safe side) and the two intersected, so
    a character is accepted only if Python's ``re`` and ECMA-262 both accept it. A positive class
    is the intersection of the dialects' member sets; a negated class is the complement of the
    *union* of what the dialects exclude (intersecting complements), which is why ``[^\\d]``
    excludes every Unicode decimal digit although ECMA's ``\\d`` is ASCII. Without ``i`` both sets
    are exact, so ``[\\s\\S]`` is every character.

    With ``case_insensitive``: positive members fold per dialect (``python_fold``: what
    ``re.IGNORECASE`` matches for each literal, escapes kept only where their whole case
    component is inside the set, since Python tests escapes on the lowercased character);
    ECMA-262 (no ``u`` flag) matches by ``Canonicalize`` (``ecma_fold``, exact). A negated class
    excludes what ECMA-262's ``Canonicalize`` relates to its members and the whole case component
    (``case_closure``) of everything Python lists: a superset of what Python excludes, which also
    lowercases the input before testing it against members and escapes.

    Memoised: the same classes recur across a schema's patterns and across schemas.
    """
    python_items = literals.union(_union(s.python for s in sets))
    ecma_items = literals.union(_union(s.ecma for s in sets))
    if not case_insensitive:
        if negated:
            return python_items.union(ecma_items).complement()
        return python_items.intersection(ecma_items)
    if negated:
        return case_closure(python_items).union(ecma_fold(ecma_items)).complement()
    python_side = python_fold(literals)
    if sets:
        python_escapes = _union(s.python for s in sets)
        python_side = python_side.union(case_closure(python_escapes.complement()).complement())
    return python_side.intersection(ecma_fold(ecma_items))


def _union(sets: Iterable[Chars]) -> Chars:
    ranges: list[tuple[int, int]] = []
    for s in sets:
        ranges.extend(s.ranges)
    return Chars(tuple(ranges))


# --- case folding ------------------------------------------------------------------------


@dataclass(frozen=True)
class _CaseTables:
    """For every code point that takes part in case mapping (``keys``, sorted): its component
    (every character any dialect could fold it with) and the characters each dialect folds it to."""

    keys: list[int]
    component: dict[int, tuple[int, ...]]
    python: dict[int, tuple[int, ...]]
    ecma: dict[int, tuple[int, ...]]


def all_characters() -> str:
    """Every Unicode scalar value, in order (no surrogates): 1,112,064 characters, for scanning
    with ``str`` predicates at C speed."""
    codes = array.array("I", range(0xD800))
    codes.extend(range(0xE000, MAX_CODE_POINT + 1))
    if codes.itemsize != 4:  # pragma: no cover - exotic platforms
        return "".join(map(chr, codes))
    return codes.tobytes().decode("utf-32-le" if sys.byteorder == "little" else "utf-32-be")


def chars_where(predicate: Callable[[str], bool], text: str | None = None) -> Chars:
    """The code points of ``text`` (default: all of Unicode) for which ``predicate`` holds."""
    ranges: list[tuple[int, int]] = []
    for ch in filter(predicate, all_characters() if text is None else text):
        cp = ord(ch)
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    return Chars(tuple(ranges))


def _ecma_canonicalize(cp: int) -> int:
    """ECMA-262 ``Canonicalize`` for a non-``u`` pattern with ``i``: code units; single-unit
    ``toUppercase`` results only; never maps a non-ASCII character into ASCII. Characters beyond
    the BMP are two code units there, each canonicalizing to itself."""
    if cp > 0xFFFF:
        return cp
    upper = chr(cp).upper()
    if len(upper) != 1 or ord(upper) > 0xFFFF:
        return cp
    if cp >= 128 and ord(upper) < 128:
        return cp
    return ord(upper)


@functools.lru_cache(maxsize=1)
def _case_tables() -> _CaseTables:
    """Case components (a deliberately generous union-find over ``lower()``/``upper()``/``casefold()``,
    single characters and whole mapping strings, and the first character of ``lower()``, which is
    Python's ``re`` lowercasing of U+0130) and each dialect's exact relation within them: Python's
    by asking ``re`` itself, ECMA-262's by ``Canonicalize``. That no dialect relates characters
    across components is what the tests check against ``re`` over all of Unicode."""
    text = all_characters()
    candidates: list[int] = []
    block = 256
    for i in range(0, len(text), block):
        chunk = text[i : i + block]
        if chunk.lower() == chunk and chunk.upper() == chunk and chunk.casefold() == chunk:
            continue
        candidates.extend(ord(ch) for ch in chunk if ch.lower() != ch or ch.upper() != ch or ch.casefold() != ch)

    parent: dict[object, object] = {}

    def find(x: object) -> object:
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(x, x) != root:
            parent[x], x = root, parent[x]
        return root

    def link(a: object, b: object) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    for cp in candidates:
        ch = chr(cp)
        for kind, mapped in (("L", ch.lower()), ("U", ch.upper()), ("F", ch.casefold())):
            link(cp, (kind, mapped))
            if len(mapped) == 1:
                link(cp, ord(mapped))
        link(cp, ord(ch.lower()[0]))  # Python's re lowercases U+0130 to 'i'
    groups: dict[object, list[int]] = {}
    for node in list(parent):
        if isinstance(node, int):
            groups.setdefault(find(node), []).append(node)
    component: dict[int, tuple[int, ...]] = {}
    python: dict[int, tuple[int, ...]] = {}
    ecma: dict[int, tuple[int, ...]] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        group = tuple(sorted(set(members)))
        for cp in group:
            component[cp] = group
            matcher = re.compile(re.escape(chr(cp)), re.IGNORECASE)
            python[cp] = tuple(c for c in group if matcher.fullmatch(chr(c)))
            canon = _ecma_canonicalize(cp)
            ecma[cp] = tuple(c for c in group if _ecma_canonicalize(c) == canon)
    return _CaseTables(sorted(component), component, python, ecma)


def _fold_with(chars: Chars, table: dict[int, tuple[int, ...]]) -> Chars:
    keys = _case_tables().keys
    extra: list[tuple[int, int]] = []
    for lo, hi in chars.ranges:
        i = bisect.bisect_left(keys, lo)
        while i < len(keys) and keys[i] <= hi:
            extra.extend((cp, cp) for cp in table[keys[i]])
            i += 1
    return Chars(chars.ranges + tuple(extra)) if extra else chars


def python_fold(chars: Chars) -> Chars:
    """Every character Python's ``re.IGNORECASE`` matches against some member of ``chars``."""
    return _fold_with(chars, _case_tables().python)


def ecma_fold(chars: Chars) -> Chars:
    """Every character ECMA-262's ``i`` (no ``u`` flag) matches against some member of ``chars``."""
    return _fold_with(chars, _case_tables().ecma)


def case_closure(chars: Chars) -> Chars:
    """``chars`` plus the whole case component of each member: a superset of what either dialect
    folds ``chars`` to, including Python's lowercasing of the input before testing an escape."""
    return _fold_with(chars, _case_tables().component)


def fold_case(chars: Chars) -> Chars:
    """What an ``i`` flag matches for the literal characters ``chars`` in our front ends: the
    characters BOTH Python's ``re.IGNORECASE`` and ECMA-262's ``i`` (no ``u``) match. So 'k' matches
    'K' but not KELVIN SIGN, and 's' not LONG S: Python folds those, ECMA-262 does not."""
    return class_set(chars, case_insensitive=True)
