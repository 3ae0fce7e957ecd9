"""Regular expressions (the ECMA-262 / Python ``re`` common subset) to the grammar IR.

This is the dialect of JSON Schema ``pattern`` and of what Python users write. Where the two
standards disagree on a construct, or where a construct is not a regular language over the whole
string (backreferences, lookaround, ``\\b``, anchors mid-pattern), we raise
``UnsupportedGrammarError`` instead of guessing: fail closed.

Which dialect, then? Both. JSON Schema says ``pattern`` is ECMA-262, but the validators people
run (Python ``jsonschema``, and the benchmark's labels) use Python's ``re`` (``re.search(pattern,
value)``, no flags). The two disagree on what ``\\d``, ``\\w``, ``\\s``, ``.`` and case-insensitive
matching accept, and a generator must never produce a string that a validator rejects. So every
character class stands for a set contained in BOTH dialects' sets. Patterns here have no
lookaround, backreferences or complement, so their language only grows with their classes: a
regex built from such subsets matches a subset of what each dialect matches.

* A class is computed in each dialect and the two intersected (``_charclass.class_set``).
  Positive ``\\d`` is therefore ``[0-9]`` (ECMA) and not Python's Unicode decimal digits;
  positive ``\\w`` is ``[A-Za-z0-9_]``; positive ``\\s`` is the whitespace both agree on (ECMA's
  WhiteSpace + LineTerminator: ``\\t\\n\\v\\f\\r``, Unicode Zs, U+2028/9 and U+FEFF; Python's
  ``str.isspace()``: also U+001C-U+001F and U+0085, but not U+FEFF), i.e. both minus U+FEFF.
* Complements take the *union*: ``\\D`` excludes every Unicode decimal digit (Python's ``\\d``),
  ``\\W`` every Python word character (``str.isalnum()`` or ``_``), ``\\S`` both dialects'
  whitespace. Inside ``[^...]`` the members are united across dialects before complementing, so
  ``[^\\d]`` rejects U+0663 too. ``[\\s\\S]`` and ``[\\d\\D]`` are still every character.
* ``.`` is any character except ``\\n``, ``\\r``, U+2028 and U+2029 (ECMA's; Python excludes only
  ``\\n``); with the ``s`` flag it is every character in both.
* Deliberate narrowings on the validation side: ``^\\w+$`` rejects "é" (Python accepts it, ECMA
  does not), ``^\\d+$`` rejects "٣", ``^.$`` rejects "\\r", ``^\\s$`` rejects U+0085 and U+FEFF,
  ``^\\S$`` rejects U+001C and U+FEFF.
* ECMA-262 is modelled per code point, as with the ``u`` flag that JSON Schema recommends.
  Without ``u`` a character beyond the BMP is two UTF-16 code units there (``^.$`` rejects an
  emoji); that length difference is not narrowed for.
* ``^`` / ``$`` are allowed only at the start / end of the pattern or of a top-level alternative;
  with full-match semantics they are no-ops. ``$`` means end of text (ECMA), never "before a final
  newline" (Python): accepting fewer strings is on the safe side.
* ``search=True`` (JSON Schema ``pattern``) allows any text, newlines included, before an
  alternative not anchored with ``^`` and after one not anchored with ``$``.
* ``\\uD83D\\uDE00``-style surrogate pairs combine into one code point; lone surrogates are errors.
* Scoped flag groups ``(?i:...)`` and ``(?s:...)`` (also ``(?-i:...)``) are accepted because Lark
  emits them when it composes terminals; global flags ``(?i)`` are unsupported. ``i`` matches a
  character only where Python's ``re.IGNORECASE`` and ECMA-262's ``Canonicalize`` (no ``u``) both
  do: 'k' matches 'K' but not KELVIN SIGN, 's' not LONG S, 'i' not U+0130/U+0131 (Python folds
  those, ECMA-262 does not), and nothing beyond the BMP folds. The pairs kept also share their
  simple case folding, so they hold under ECMA's ``u`` flag too. Inside ``[^...]`` under ``i`` the
  excluded set is widened to whole case components (see ``_charclass.class_set``).
* Dialect-ambiguous spellings fail closed: ``{,n}``, ``]`` first in a class, octal escapes,
  ``\\e``-style escapes of other ASCII letters, ``\\d`` as a range endpoint. A ``{`` that does not
  form ``{m}``/``{m,}``/``{m,n}`` is a literal.

The Unicode sets are the running interpreter's (``str.isdecimal``/``isalnum``/``isspace``, which
are what ``re`` uses), computed once on first use (a few tenths of a second).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable

from grammars.automata.frames import Frame, run_frames
from grammars.errors import UnsupportedGrammarError
from grammars.frontends._charclass import (
    ANY_CHAR,
    ClassItem,
    Cursor,
    DialectChars,
    chars_where,
    check_code_point,
    class_set,
    fold_case,
    parse_class_body,
    read_hex_digits,
    read_hex_escape,
)
from grammars.ir import EMPTY, Chars, Expr, Literal, alt, chars, repeat, seq

__all__ = ["parse_regex", "parse_terminal_regex", "DIGIT", "WORD", "SPACE", "DOT", "class_escape"]

# ECMA-262's sets (with the ``u`` flag, and without ``i``, they are the same)
_ECMA_DIGIT = chars(("0", "9"))
_ECMA_WORD = chars(("0", "9"), ("A", "Z"), ("a", "z"), "_")
#: WhiteSpace (TAB VT FF ZWNBSP, and SP NBSP and the rest of Unicode's Zs, unchanged since
#: Unicode 6.3) + LineTerminator (LF CR LS PS)
_ECMA_SPACE = chars("\t\n\v\f\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff", ("\u2000", "\u200a"))
#: ECMA-262's LineTerminator: what ``.`` never matches there without the ``s`` flag
_ECMA_LINE_TERMINATORS = chars("\n\r\u2028\u2029")


def _text(members: Chars) -> str:
    return "".join(chr(cp) for lo, hi in members.ranges for cp in range(lo, hi + 1))


#: positive ``\d``: the digits both dialects accept (ECMA's ``[0-9]``)
DIGIT = _ECMA_DIGIT
#: positive ``\w``: ``[A-Za-z0-9_]`` (every ASCII word character is a Python word character)
WORD = _ECMA_WORD
#: positive ``\s``: ECMA-262's whitespace that Python's ``str.isspace()`` also accepts (all but U+FEFF)
SPACE = chars_where(str.isspace, _text(_ECMA_SPACE))
#: ``.`` without the ``s`` flag: Python excludes ``\n``, ECMA-262 every line terminator
DOT = _ECMA_LINE_TERMINATORS.complement()


@functools.lru_cache(maxsize=None)
def class_escape(letter: str) -> DialectChars:
    """``\\d``, ``\\D``, ``\\w``, ``\\W``, ``\\s`` or ``\\S`` (``letter``) in each dialect. Python's sets
    are those of ``re`` on a ``str`` pattern without flags: ``str.isdecimal()`` (category Nd),
    ``str.isalnum()`` or ``_``, ``str.isspace()``; computed over all of Unicode on first use."""
    if letter in "DWS":
        return class_escape(letter.lower()).negated()
    if letter == "d":
        return DialectChars(chars_where(str.isdecimal), _ECMA_DIGIT)
    if letter == "w":
        return DialectChars(chars_where(str.isalnum).union(chars("_")), _ECMA_WORD)
    if letter == "s":
        return DialectChars(chars_where(str.isspace), _ECMA_SPACE)
    raise ValueError(f"not a class escape: \\{letter}")


_CLASS_ESCAPE_LETTERS = frozenset("dDwWsS")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_UNSUPPORTED_ESCAPES = {
    "b": "word boundary \\b",
    "B": "word boundary \\B",
    "A": "anchor \\A",
    "Z": "anchor \\Z",
    "z": "anchor \\z",
    "G": "anchor \\G",
    "k": "named backreference \\k",
    "p": "Unicode property escape \\p",
    "P": "Unicode property escape \\P",
    "c": "control escape \\c",
    "N": "named character escape \\N",
}
_SUPPORTED_FLAGS = frozenset("is")
_QUANTIFIER_START = "*+?{"


def parse_regex(pattern: str, *, search: bool = False, flags: str = "", source: str = "<regex>") -> Expr:
    """The language of ``pattern`` as an IR expression.

    Full-match semantics by default; ``search=True`` means "matches anywhere", as JSON Schema's
    ``pattern`` does. ``flags`` may contain ``i`` (ignore case) and ``s`` (``.`` matches newline).
    Raises ``GrammarSyntaxError`` (with the offset) for malformed patterns and
    ``UnsupportedGrammarError`` for constructs outside the supported subset, and ``TypeError``
    for arguments that are not text.
    """
    _require_text("parse_regex", pattern=pattern, flags=flags, source=source)
    parser = _RegexParser(pattern, source, _check_flags(flags), anchors=True)
    return parser.parse(search=search)


def _require_text(function: str, **arguments: object) -> None:
    for name, value in arguments.items():
        if not isinstance(value, str):
            raise TypeError(f"{function}: {name} must be a str, got {type(value).__name__}")


def parse_terminal_regex(pattern: str, *, flags: str = "", source: str = "<regex>") -> Expr:
    """A regex used as a lexer terminal (Lark): full match, and anchors fail closed, because a
    terminal matched mid-text makes ``^``/``$`` mean something other than a no-op."""
    return _RegexParser(pattern, source, _check_flags(flags), anchors=False).parse(search=False)


def _check_flags(flags: str) -> frozenset[str]:
    unknown = sorted(set(flags) - _SUPPORTED_FLAGS)
    if unknown:
        raise UnsupportedGrammarError(f"unsupported regex flag(s) {''.join(unknown)!r} (supported: 'i', 's')")
    return frozenset(flags)


@dataclass(frozen=True)
class _Anchor:
    """A ``^`` or ``$`` seen at the top level; kept until we know whether it is at an edge."""

    kind: str
    offset: int


_Item = Expr | _Anchor


class _RegexParser:
    """Recursive descent over the pattern: alternation > branch > quantified atom. A group
    nests an alternation: those methods are frames (``run_frames``), so groups may nest
    deeper than Python's recursion limit."""

    def __init__(self, pattern: str, source: str, flags: frozenset[str], *, anchors: bool) -> None:
        self.cur = Cursor(pattern, source)
        self.flags = flags
        self.anchors = anchors
        self.group_names: set[str] = set()

    # --- structure ---------------------------------------------------------------------

    def parse(self, *, search: bool) -> Expr:
        return run_frames(self._parse(search))

    def _parse(self, search: bool) -> Frame:  # -> Expr
        branches = [(yield self._branch(self.flags, top=True))]
        while self.cur.take_if("|"):
            branches.append((yield self._branch(self.flags, top=True)))
        if not self.cur.at_end():
            raise self.cur.error("unbalanced parenthesis")
        tops = [self._top_branch(items) for items in branches]
        if not search:
            return alt(body for _, _, body in tops)
        # branches anchored alike share one padding: ``^a|b|c$`` searches as ``a.* | .*b.* | .*c``,
        # and ``x|y|z`` as ``.*(x|y|z).*``, not as a copy of ``.*`` per branch, each of which the
        # subset construction would follow at once
        groups: dict[tuple[bool, bool], list[Expr]] = {}
        for start_anchored, end_anchored, body in tops:
            groups.setdefault((start_anchored, end_anchored), []).append(body)
        anything = repeat(ANY_CHAR)
        padded = []
        for (start_anchored, end_anchored), bodies in groups.items():
            body = alt(bodies)
            if EMPTY in bodies and not (start_anchored and end_anchored):
                padded.append(anything)  # one star, not two: avoids a needlessly ambiguous ANY* ANY*
            else:
                padded.append(seq([_unless(start_anchored, anything), body, _unless(end_anchored, anything)]))
        return alt(padded)

    def _top_branch(self, items: list[_Item]) -> tuple[bool, bool, Expr]:
        """Strip edge anchors (no-ops under full match; the search padding they remove) and
        reject inner ones: (anchored at the start, anchored at the end, the branch's body)."""
        start_anchored = end_anchored = False
        while items and isinstance(items[0], _Anchor) and items[0].kind == "^":
            items, start_anchored = items[1:], True
        while items and isinstance(items[-1], _Anchor) and items[-1].kind == "$":
            items, end_anchored = items[:-1], True
        for item in items:
            if isinstance(item, _Anchor):
                raise self.cur.unsupported(f"anchor {item.kind!r} in the middle of the pattern", item.offset)
        return start_anchored, end_anchored, _join(items)  # type: ignore[arg-type]

    def _alternation(self, flags: frozenset[str]) -> Frame:  # -> Expr
        branches = [(yield self._branch(flags, top=False))]
        while self.cur.take_if("|"):
            branches.append((yield self._branch(flags, top=False)))
        return alt(_join(items) for items in branches)  # type: ignore[arg-type]

    def _branch(self, flags: frozenset[str], *, top: bool) -> Frame:  # -> list[_Item]
        items: list[_Item] = []
        while not self.cur.at_end() and self.cur.peek() not in "|)":
            if self.cur.peek() == "(":
                atom = yield self._group(flags)
            else:
                atom = self._atom(flags, top=top)
            if isinstance(atom, _Anchor):
                if self._quantifier_ahead():
                    raise self.cur.error("nothing to repeat")
                items.append(atom)
            else:
                items.append(self._quantified(atom))
        return items

    # --- quantifiers -------------------------------------------------------------------

    def _quantified(self, atom: Expr) -> Expr:
        bounds = self._quantifier()
        if bounds is None:
            return atom
        if not self.cur.take_if("?") and self.cur.peek() == "+":
            raise self.cur.unsupported("possessive quantifier")
        if self._quantifier_ahead():
            raise self.cur.error("multiple repeat")
        return repeat(atom, *bounds)

    def _quantifier(self) -> tuple[int, int | None] | None:
        """Consume a quantifier and return its bounds; ``None`` (nothing consumed) if there is none."""
        ch = self.cur.peek()
        if ch in ("*", "+", "?"):
            self.cur.take()
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        if ch == "{":
            return self._braces()
        return None

    def _braces(self) -> tuple[int, int | None] | None:
        """``{m}``, ``{m,}``, ``{m,n}``; any other ``{`` is a literal, so this consumes nothing then."""
        cur, start = self.cur, self.cur.pos
        cur.take()
        low = self._digits()
        if low is None:
            if cur.take_if(","):
                self._digits()
                if cur.peek() == "}":
                    raise cur.unsupported("'{,n}' quantifier (Python reads {0,n}, ECMA-262 a literal)", start)
            cur.pos = start
            return None
        high: int | None = low
        if cur.take_if(","):
            high = self._digits()
        if not cur.take_if("}"):
            cur.pos = start
            return None
        if high is not None and high < low:
            raise cur.error("min repeat greater than max repeat", start)
        return (low, high)

    def _digits(self) -> int | None:
        start = self.cur.pos
        while self.cur.peek().isascii() and self.cur.peek().isdigit():
            self.cur.take()
        return int(self.cur.text[start : self.cur.pos]) if self.cur.pos > start else None

    def _quantifier_ahead(self) -> bool:
        start = self.cur.pos
        try:
            return self._quantifier() is not None
        finally:
            self.cur.pos = start

    # --- atoms -------------------------------------------------------------------------

    def _atom(self, flags: frozenset[str], *, top: bool) -> Expr | _Anchor:
        cur = self.cur
        ch = cur.peek()  # "(" opens a group, which ``_branch`` parses
        if ch == "[":
            return self._class(flags)
        if ch == ".":
            cur.take()
            return ANY_CHAR if "s" in flags else DOT
        if ch in ("^", "$"):
            return self._anchor(top)
        if ch == "\\":
            item = self._escape(in_class=False)
            if isinstance(item, DialectChars):
                return class_set(Chars(()), (item,), case_insensitive="i" in flags)
            assert isinstance(item, int)
            return _char(item, flags)
        if ch in _QUANTIFIER_START and self._quantifier_ahead():
            raise cur.error("nothing to repeat")
        cur.take()
        return _char(check_code_point(cur, ord(ch), cur.pos - 1), flags)

    def _anchor(self, top: bool) -> _Anchor:
        offset = self.cur.pos
        kind = self.cur.take()
        if not self.anchors:
            raise self.cur.unsupported(f"anchor {kind!r} in a terminal", offset)
        if not top:
            raise self.cur.unsupported(f"anchor {kind!r} inside a group", offset)
        return _Anchor(kind, offset)

    def _group(self, flags: frozenset[str]) -> Frame:  # -> Expr
        cur, start = self.cur, self.cur.pos
        cur.take()
        if cur.take_if("?"):
            flags = self._group_extension(flags, start)
        body = yield self._alternation(flags)
        if not cur.take_if(")"):
            raise cur.error("missing ')': unterminated group", start)
        return body

    def _group_extension(self, flags: frozenset[str], start: int) -> frozenset[str]:
        """After ``(?``: accept non-capturing, named and scoped-flag groups; return the body's flags."""
        cur = self.cur
        if cur.take_if(":"):
            return flags
        if cur.take_if("P<") or (cur.peek() == "<" and cur.peek(1) not in ("=", "!") and cur.take_if("<")):
            self._group_name(start)
            return flags
        for prefix, construct in (
            ("P=", "backreference (?P=name)"),
            ("<=", "lookbehind"),
            ("<!", "negative lookbehind"),
            ("=", "lookahead"),
            ("!", "negative lookahead"),
            (">", "atomic group"),
            ("#", "comment group"),
            ("(", "conditional group"),
        ):
            if cur.text.startswith(prefix, cur.pos):
                raise cur.unsupported(construct, start)
        return self._scoped_flags(flags, start)

    def _group_name(self, start: int) -> None:
        cur = self.cur
        end = cur.text.find(">", cur.pos)
        if end < 0:
            raise cur.error("missing '>' after group name", start)
        name = cur.text[cur.pos : end]
        if not name.isidentifier():
            raise cur.error(f"bad group name {name!r}", cur.pos)
        if name in self.group_names:
            raise cur.error(f"redefinition of group name {name!r}", cur.pos)
        self.group_names.add(name)
        cur.pos = end + 1

    def _scoped_flags(self, flags: frozenset[str], start: int) -> frozenset[str]:
        cur = self.cur
        on = off = ""
        while cur.peek().isascii() and cur.peek().isalpha():
            on += cur.take()
        if cur.take_if("-"):
            while cur.peek().isascii() and cur.peek().isalpha():
                off += cur.take()
        if not (on or off) or cur.peek() not in (":", ")"):
            raise cur.error("unknown group extension after '(?'", start)
        if cur.peek() == ")":
            raise cur.unsupported("global inline flags (?...)", start)
        cur.take()
        unknown = sorted(set(on + off) - _SUPPORTED_FLAGS)
        if unknown:
            raise cur.unsupported(f"inline flag {unknown[0]!r}", start)
        return (flags | frozenset(on)) - frozenset(off)

    def _class(self, flags: frozenset[str]) -> Chars:
        cur, start = self.cur, self.cur.pos
        cur.take()
        if cur.peek() == "]" or (cur.peek() == "^" and cur.peek(1) == "]"):
            raise cur.unsupported("']' first in a class (empty class in ECMA-262, literal in Python)", start)
        return parse_class_body(cur, self._class_item, start, case_insensitive="i" in flags)

    def _class_item(self, cur: Cursor) -> ClassItem:
        if cur.peek() == "\\":
            return self._escape(in_class=True)
        cur.take()
        return check_code_point(cur, ord(cur.text[cur.pos - 1]), cur.pos - 1)

    # --- escapes -----------------------------------------------------------------------

    def _escape(self, *, in_class: bool) -> ClassItem:
        """One backslash escape: a code point, or a set for ``\\d``-style class escapes."""
        cur, start = self.cur, self.cur.pos
        cur.take()
        if cur.at_end():
            raise cur.error("pattern ends with a backslash", start)
        ch = cur.take()
        if ch in _SIMPLE_ESCAPES:
            return ord(_SIMPLE_ESCAPES[ch])
        if ch in _CLASS_ESCAPE_LETTERS:
            return class_escape(ch)
        if ch == "x":
            return read_hex_escape(cur, 2, start)
        if ch == "u":
            return self._u_escape(start)
        if ch == "U":
            return read_hex_escape(cur, 8, start)
        if ch == "b" and in_class:
            return 0x08
        if ch.isascii() and ch.isdigit():
            return self._digit_escape(ch, start, in_class)
        if ch in _UNSUPPORTED_ESCAPES:
            raise cur.unsupported(_UNSUPPORTED_ESCAPES[ch], start)
        if ch.isascii() and ch.isalnum():
            raise cur.unsupported(f"escape \\{ch} (an error in Python, the letter itself in ECMA-262)", start)
        return check_code_point(cur, ord(ch), start)

    def _digit_escape(self, digit: str, start: int, in_class: bool) -> int:
        cur = self.cur
        if digit == "0" and not (cur.peek().isascii() and cur.peek().isdigit()):
            return 0
        if digit == "0" or in_class:
            raise cur.unsupported("octal escape", start)
        raise cur.unsupported("backreference", start)

    def _u_escape(self, start: int) -> int:
        """``\\uHHHH`` (a UTF-16 surrogate pair combines) or ``\\u{H...}``."""
        cur = self.cur
        if cur.take_if("{"):
            close = cur.text.find("}", cur.pos)
            digits = cur.text[cur.pos : close] if close >= 0 else ""
            if not 1 <= len(digits) <= 8 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise cur.error("bad \\u{...} escape", start)
            cur.pos = close + 1
            return check_code_point(cur, int(digits, 16), start)
        value = read_hex_digits(cur, 4, start)
        if 0xD800 <= value <= 0xDBFF and cur.text.startswith("\\u", cur.pos):
            resume = cur.pos
            cur.pos += 2
            low = read_hex_digits(cur, 4, resume)
            if 0xDC00 <= low <= 0xDFFF:
                return 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
            cur.pos = resume
        return check_code_point(cur, value, start)


def _unless(condition: bool, expr: Expr) -> Expr:
    """``expr``, or the empty string when ``condition`` holds (search padding at an anchored end)."""
    return EMPTY if condition else expr


def _char(code_point: int, flags: frozenset[str]) -> Expr:
    """One literal character, widened under the ``i`` flag to the case variants both dialects match."""
    if "i" in flags:
        folded = fold_case(Chars(((code_point, code_point),)))
        if folded.ranges != ((code_point, code_point),):
            return folded
    return Literal(chr(code_point))


def _join(items: Iterable[Expr]) -> Expr:
    """A sequence, with adjacent single characters merged into one ``Literal`` for readability."""
    out: list[Expr] = []
    for item in items:
        if isinstance(item, Literal) and out and isinstance(out[-1], Literal):
            out[-1] = Literal(out[-1].text + item.text)
        else:
            out.append(item)
    return seq(out)
