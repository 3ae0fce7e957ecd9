"""llama.cpp GBNF to the grammar IR.

Follows llama.cpp's ``llama-grammar.cpp`` parser, with these deliberate differences:

* Rule names may also contain ``_`` (``[a-zA-Z0-9_-]+``).
* A rule may continue on the next line anywhere (not only inside parentheses or after ``|``);
  a new rule starts where a line begins with ``name ::=``. Every grammar llama.cpp accepts
  splits into the same rules.
* A rule defined twice is an error (llama.cpp silently keeps the last definition), as is a
  reversed range ``[z-a]`` (llama.cpp silently matches nothing).
* Token-level syntax of newer llama.cpp (``<[id]>``, ``<|token|>``, ``!``) fails closed with
  ``UnsupportedGrammarError``: it constrains tokens, not characters.

Escapes are ``\\n \\r \\t \\\\ \\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH``; ``\\xHH`` is the code point
U+00HH, not a byte. ``.`` is any character, newline included. The start rule is ``root``.
"""

from __future__ import annotations

from grammars.automata.frames import Frame, run_frames
from grammars.frontends._charclass import (
    ANY_CHAR,
    Cursor,
    check_code_point,
    parse_class_body,
    read_hex_escape,
)
from grammars.ir import Expr, Grammar, Literal, Ref, alt, repeat, seq

__all__ = ["parse_gbnf"]

_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_START_RULE = "root"


def parse_gbnf(text: str, *, source: str = "<gbnf>") -> Grammar:
    """Parse GBNF ``text`` into a ``Grammar`` whose start rule is ``root``.

    Raises ``GrammarSyntaxError`` (line, column, caret) for malformed text, references to
    undefined rules, duplicate rules or a missing ``root``; ``TypeError`` when ``text`` or
    ``source`` is not a str.
    """
    for name, value in (("text", text), ("source", source)):
        if not isinstance(value, str):
            raise TypeError(f"parse_gbnf: {name} must be a str, got {type(value).__name__}")
    return _GbnfParser(text, source).parse()


class _GbnfParser:
    def __init__(self, text: str, source: str) -> None:
        self.cur = Cursor(text, source)
        self.rules: dict[str, Expr] = {}
        self.references: list[tuple[str, int]] = []

    def parse(self) -> Grammar:
        self._skip_space()
        while not self.cur.at_end():
            self._rule()
        for name, offset in self.references:
            if name not in self.rules:
                raise self.cur.error(f"undefined rule {name!r}", offset)
        if _START_RULE not in self.rules:
            raise self.cur.error(f"grammar has no {_START_RULE!r} rule", 0)
        return Grammar.of(self.rules, _START_RULE, self.cur.source)

    # --- layout ------------------------------------------------------------------------

    def _skip_space(self, *, newlines: bool = True) -> bool:
        """Skip blanks and ``#`` comments (and newlines if allowed); return whether a newline was crossed."""
        cur, crossed = self.cur, False
        while True:
            ch = cur.peek()
            if ch in (" ", "\t"):
                cur.take()
            elif ch == "#":
                while cur.peek() not in ("", "\n", "\r"):
                    cur.take()
            elif ch in ("\n", "\r") and newlines:
                cur.take()
                crossed = True
            else:
                return crossed

    def _at_rule_start(self) -> bool:
        """Whether ``name ::=`` begins here (without consuming it)."""
        cur, start = self.cur, self.cur.pos
        try:
            if self._name_text() is None:
                return False
            self._skip_space(newlines=False)
            return cur.text.startswith("::=", cur.pos)
        finally:
            cur.pos = start

    def _name_text(self) -> str | None:
        cur, start = self.cur, self.cur.pos
        while cur.peek() in _NAME_CHARS and cur.peek():
            cur.take()
        return cur.text[start : cur.pos] or None

    # --- rules and expressions ---------------------------------------------------------

    def _rule(self) -> None:
        cur, start = self.cur, self.cur.pos
        name = self._name_text()
        if name is None:
            raise cur.error("expected a rule name")
        self._skip_space(newlines=False)
        if not cur.take_if("::="):
            raise cur.error("expected '::=' after the rule name")
        if name in self.rules:
            raise cur.error(f"rule {name!r} is defined twice", start)
        self.rules[name] = run_frames(self._alternates(depth=0))
        if cur.peek() == ")":
            raise cur.error("unbalanced ')'")

    def _alternates(self, depth: int) -> Frame:  # -> Expr
        """Alternatives; a parenthesised group nests another. These methods are frames
        (``run_frames``), so groups may nest deeper than Python's recursion limit."""
        branches = [(yield self._sequence(depth))]
        while self.cur.take_if("|"):
            branches.append((yield self._sequence(depth)))
        return alt(branches)

    def _sequence(self, depth: int) -> Frame:  # -> Expr
        """Items until ``|``, ``)``, the end, or (at top level) a line starting a new rule."""
        cur = self.cur
        items: list[Expr] = []
        while True:
            crossed = self._skip_space()
            if cur.at_end() or cur.peek() in ("|", ")"):
                break
            if crossed and depth == 0 and self._at_rule_start():
                break
            if cur.peek() in "*+?{":
                if not items:
                    raise cur.error(f"expected an item before {cur.peek()!r}")
                items[-1] = self._quantified(items[-1])
            elif cur.peek() == "(":
                start = cur.pos
                cur.take()
                body = yield self._alternates(depth + 1)
                if not cur.take_if(")"):
                    raise cur.error("expected ')'", start)
                items.append(body)
            else:
                items.append(self._item(depth))
        return seq(items)

    def _item(self, depth: int) -> Expr:
        """One item other than a group (``_sequence`` parses those)."""
        cur, start = self.cur, self.cur.pos
        ch = cur.peek()
        if ch == '"':
            return self._literal()
        if ch == "[":
            cur.take()
            return parse_class_body(cur, self._char, start)
        if ch == ".":
            cur.take()
            return ANY_CHAR
        if ch in ("<", "!"):
            raise cur.unsupported("token-level GBNF syntax (matches tokens, not characters)")
        name = self._name_text()
        if name is None:
            raise cur.error(f"unexpected character {ch!r}")
        self.references.append((name, start))
        return Ref(name)

    def _literal(self) -> Expr:
        cur, start = self.cur, self.cur.pos
        cur.take()
        text: list[str] = []
        while not cur.take_if('"'):
            if cur.at_end():
                raise cur.error("unterminated string literal", start)
            text.append(chr(self._char(cur)))
        return Literal("".join(text))

    def _char(self, cur: Cursor) -> int:
        """One character of a literal or class, escapes decoded."""
        start = cur.pos
        ch = cur.take()
        if ch != "\\":
            return check_code_point(cur, ord(ch), start)
        esc = cur.take()
        if esc in _SIMPLE_ESCAPES:
            return ord(_SIMPLE_ESCAPES[esc])
        if esc in _HEX_ESCAPES:
            return read_hex_escape(cur, _HEX_ESCAPES[esc], start)
        raise cur.error(f"unknown escape '\\{esc}'", start)

    def _quantified(self, item: Expr) -> Expr:
        cur = self.cur
        ch = cur.take()
        if ch == "*":
            return repeat(item, 0, None)
        if ch == "+":
            return repeat(item, 1, None)
        if ch == "?":
            return repeat(item, 0, 1)
        return repeat(item, *self._braces(cur.pos - 1))

    def _braces(self, start: int) -> tuple[int, int | None]:
        """The rest of ``{m}``, ``{m,}`` or ``{m,n}`` (blanks allowed inside, as in llama.cpp)."""
        cur = self.cur
        self._skip_space(newlines=False)
        low = self._int()
        self._skip_space(newlines=False)
        high: int | None = low
        if cur.take_if(","):
            self._skip_space(newlines=False)
            high = self._int() if cur.peek().isdigit() else None
            self._skip_space(newlines=False)
        if not cur.take_if("}"):
            raise cur.error("expected '}' to close the repetition")
        if high is not None and high < low:
            raise cur.error(f"bad repetition bounds {{{low},{high}}}", start)
        return low, high

    def _int(self) -> int:
        cur, start = self.cur, self.cur.pos
        while cur.peek().isascii() and cur.peek().isdigit():
            cur.take()
        if cur.pos == start:
            raise cur.error("expected an integer")
        return int(cur.text[start : cur.pos])
