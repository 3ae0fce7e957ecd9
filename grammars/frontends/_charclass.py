"""What the hand-written front ends (regex, GBNF) share: a cursor with positioned errors,
numeric escapes, ``[...]`` class bodies and case folding.

Keeping these in one place means ``\\x41`` or ``[a-z]`` cannot mean slightly different things
in two dialects by accident; each dialect only supplies its own table of escapes.
"""

from __future__ import annotations

import bisect
import functools
from typing import Callable, Union

from grammars.errors import GrammarSyntaxError, SourcePosition, UnsupportedGrammarError
from grammars.ir import MAX_CODE_POINT, Chars

__all__ = [
    "Cursor",
    "ClassItem",
    "read_hex_digits",
    "read_hex_escape",
    "check_code_point",
    "parse_class_body",
    "fold_case",
    "ANY_CHAR",
]

#: every Unicode scalar value (surrogates are cut out by ``Chars`` itself)
ANY_CHAR = Chars(((0, MAX_CODE_POINT),))

#: one member of a class as read by a dialect: a single code point, or a whole set (``\d``)
ClassItem = Union[int, Chars]

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
    fold: Callable[[Chars], Chars] | None = None,
) -> Chars:
    """The rest of a ``[...]`` class, the cursor just past ``[``; returns the (possibly negated) set.

    ``a-b`` is a range unless ``-`` is last; a set-valued item (``\\d``) as a range end fails closed
    because dialects disagree on it. ``fold`` (case folding) applies to literal members before
    negation, as Python's ``re`` does, but never to set-valued items.
    """
    negated = cur.take_if("^")
    ranges: list[tuple[int, int]] = []
    sets: list[Chars] = []
    while cur.peek() != "]":
        if cur.at_end():
            raise cur.error("unterminated character class", start)
        item_start = cur.pos
        low = read_item(cur)
        if cur.peek() == "-" and cur.peek(1) not in ("]", ""):
            cur.take()
            high = read_item(cur)
            ranges.append(_range(cur, low, high, item_start))
        elif isinstance(low, Chars):
            sets.append(low)
        else:
            ranges.append((low, low))
    cur.take()
    members = Chars(tuple(ranges))
    if fold is not None:
        members = fold(members)
    for extra in sets:
        members = members.union(extra)
    return members.complement() if negated else members


def _range(cur: Cursor, low: ClassItem, high: ClassItem, start: int) -> tuple[int, int]:
    if isinstance(low, Chars) or isinstance(high, Chars):
        raise cur.unsupported("character-class escape as a range endpoint", start)
    if high < low:
        raise cur.error(f"bad character range {chr(low)!r}-{chr(high)!r}", start)
    return (low, high)


# --- case folding ------------------------------------------------------------------------

# Cased characters live below U+1F000 (the last are Adlam, U+1E900-U+1E94B).
_CASED_LIMIT = 0x1F000


@functools.lru_cache(maxsize=1)
def _case_classes() -> tuple[list[int], dict[int, tuple[int, ...]]]:
    """Sorted cased code points and, for each, every code point it matches case-insensitively.

    Classes are the transitive closure of single-character ``lower()``/``upper()``, which puts
    'k', 'K' and KELVIN SIGN together, and 's', 'S' and LONG S, as Python's ``re`` does.
    """
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for cp in range(_CASED_LIMIT):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        for other in (ch.lower(), ch.upper()):
            if len(other) == 1 and other != ch:
                a, b = find(cp), find(ord(other))
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for cp in list(parent):
        groups.setdefault(find(cp), []).append(cp)
    members: dict[int, tuple[int, ...]] = {}
    for root, cps in groups.items():
        group = tuple(sorted(set(cps) | {root}))
        for cp in group:
            members[cp] = group
    return sorted(members), members


def fold_case(chars: Chars) -> Chars:
    """``chars`` plus every case variant of its members (the set an ``i`` flag matches)."""
    keys, members = _case_classes()
    extra: list[tuple[int, int]] = []
    for lo, hi in chars.ranges:
        i = bisect.bisect_left(keys, lo)
        while i < len(keys) and keys[i] <= hi:
            extra.extend((cp, cp) for cp in members[keys[i]])
            i += 1
    return Chars(chars.ranges + tuple(extra)) if extra else chars
