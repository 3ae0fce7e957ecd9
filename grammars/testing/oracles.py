"""Independent reference semantics for the grammar IR, for tests only.

``char_level_accepts`` answers "is this text in the grammar's language?" with Lark's Earley
parser over a character-level translation of the IR: every ``Chars`` becomes a one-character
regex terminal and every ``Literal`` a fixed-text terminal, so Lark's lexer never has a choice
to make and the answer is exactly the CFG's (no maximal munch, no priorities). It shares no
code with corral's compiler, which is what makes it useful as an oracle. It is slow; use it on
small inputs.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable

from lark import Lark
from lark.exceptions import UnexpectedInput

from grammars.ir import (
    MAX_CODE_POINT,
    Alt,
    Chars,
    Expr,
    Grammar,
    Literal,
    Ref,
    Repeat,
    Seq,
)

__all__ = ["ir_to_lark", "char_level_accepts"]

# ASCII punctuation is written as ``\<char>``, which Python's ``re`` reads as the character itself
# and Lark's escape pre-processing leaves alone; everything else non-alphanumeric as \\uXXXX.
_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ ")
_NOTHING_PATTERN = f"[^{chr(0x5C)}u0000-{chr(0x5C)}U{MAX_CODE_POINT:08x}]"


def ir_to_lark(grammar: Grammar) -> str:
    """Lark grammar text equivalent to ``grammar`` at the character level; start rule ``start``."""
    return _Translator(grammar).text()


def char_level_accepts(grammar: Grammar, text: str) -> bool:
    """Whether ``text`` is in the language of ``grammar`` (Lark Earley, ``dynamic_complete``)."""
    parser = _parser(grammar)
    try:
        parser.parse(text)
    except UnexpectedInput:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _parser(grammar: Grammar) -> Lark:
    return Lark(ir_to_lark(grammar), parser="earley", lexer="dynamic_complete", start="start")


class _Translator:
    """Renames rules to ``start``/``r<i>``, gives each distinct character set or literal one terminal
    and each distinct compound sub-expression one helper rule ``h<i>``.

    Helper rules keep the Lark grammar linear in the IR's size: Lark inlines parenthesised
    groups and ``?`` by multiplying out alternatives, which explodes on grammars like json.gbnf.
    """

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self.rule_names = {name: f"r{i}" for i, (name, _) in enumerate(grammar.rules)}
        self.rule_names[grammar.start] = "start"
        self.terminals: dict[Expr, str] = {}
        self.helpers: dict[object, str] = {}
        self.helper_rules: list[str] = []

    def text(self) -> str:
        rules = [self._rule_line(name, body) for name, body in self.grammar.rules]
        terminals = [f"{name}: /{pattern}/" for name, pattern in self._terminal_patterns()]
        return "\n".join(rules + self.helper_rules + terminals) + "\n"

    def _rule_line(self, name: str, body: Expr) -> str:
        return f"{self.rule_names[name]}: {' | '.join(self._alternatives(body))}"

    def _symbol(self, expr: Expr) -> str:
        """One Lark symbol deriving exactly ``expr`` (``""`` for the empty string)."""
        if expr == Literal(""):
            return ""
        if isinstance(expr, (Chars, Literal)):
            return self._terminal(expr)
        if isinstance(expr, Ref):
            if expr.name not in self.rule_names:
                raise KeyError(f"reference to undefined rule {expr.name!r}")
            return self.rule_names[expr.name]
        return self._helper(expr, lambda: self._alternatives(expr))

    def _alternatives(self, expr: Expr) -> list[str]:
        """``expr`` as Lark alternatives, each a space-separated sequence of symbols."""
        if isinstance(expr, Alt):
            return [self._symbol(item) for item in expr.items]
        if isinstance(expr, Seq):
            return [_join(self._symbol(item) for item in expr.items)]
        if isinstance(expr, Repeat):
            item = self._symbol(expr.item)
            tail = self._star(item) if expr.max is None else self._up_to(item, expr.max - expr.min)
            return [_join([item] * expr.min + [tail])]
        if isinstance(expr, (Chars, Literal, Ref)):
            return [self._symbol(expr)]
        raise TypeError(f"not an IR expression: {expr!r}")

    def _star(self, item: str) -> str:
        """Zero or more ``item`` (left recursion: fine for Earley)."""
        if not item:
            return ""
        key = ("*", item)
        return self._helper(key, lambda: ["", _join([self.helpers[key], item])])

    def _up_to(self, item: str, count: int) -> str:
        """Zero to ``count`` copies of ``item`` with O(log count) unambiguous rules.

        Odd ``2m+1``: up to ``m`` pairs then an optional single copy; even ``2m``: empty, or one
        copy then up to ``2m-1``. (Lark's analysis is quadratic in rules, so no linear chains.)
        """
        if count == 0 or not item:
            return ""
        if count % 2 == 0:
            return self._helper(("?", item, count), lambda: ["", _join([item, self._up_to(item, count - 1)])])
        pairs = ""
        if count > 1:
            pairs = self._up_to(self._helper(("pair", item), lambda: [f"{item} {item}"]), count // 2)
        return self._helper(("?", item, count), lambda: [_join([pairs, item]), pairs])

    def _helper(self, key: object, alternatives: Callable[[], list[str]]) -> str:
        if key not in self.helpers:
            self.helpers[key] = name = f"h{len(self.helpers)}"
            self.helper_rules.append(f"{name}: {' | '.join(alternatives())}")
        return self.helpers[key]

    def _terminal(self, expr: Chars | Literal) -> str:
        if expr not in self.terminals:
            self.terminals[expr] = f"T{len(self.terminals)}"
        return self.terminals[expr]

    def _terminal_patterns(self) -> list[tuple[str, str]]:
        out = []
        for expr, name in self.terminals.items():
            if isinstance(expr, Literal):
                pattern = "".join(_re_char(ord(c)) for c in expr.text)
            elif expr.is_empty:
                pattern = _NOTHING_PATTERN
            else:
                pattern = "[" + "".join(_re_range(lo, hi) for lo, hi in expr.ranges) + "]"
            out.append((name, pattern))
        return out


def _join(symbols: Iterable[str]) -> str:
    return " ".join(symbol for symbol in symbols if symbol)


def _re_range(lo: int, hi: int) -> str:
    return _re_char(lo) if lo == hi else f"{_re_char(lo)}-{_re_char(hi)}"


def _re_char(code_point: int) -> str:
    """One code point as Lark regex-literal text that survives Lark's escape handling."""
    ch = chr(code_point)
    if ch.isascii() and ch.isalnum():
        return ch
    if ch in _PUNCTUATION:
        return "\\" + ch
    return f"\\u{code_point:04x}" if code_point <= 0xFFFF else f"\\U{code_point:08x}"
