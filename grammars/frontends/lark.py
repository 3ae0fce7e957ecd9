"""Lark grammars to the grammar IR, through Lark's own loader.

Lark itself resolves ``%import`` (``common.lark`` and friends), templates, ``?rule``/``_rule``
inlining, aliases and EBNF operators; we translate its compiled output (terminal patterns and
BNF rules). Tree-shaping features (aliases, ``?``/``_``/``!``) and priorities only choose between
parses, so they do not change the language and are dropped.

Semantics: a Lark grammar means what Lark's Earley parser with ``lexer="dynamic_complete"``
accepts: a character-level CFG, every terminal an exact regular language, no maximal munch.
``%ignore``d terminals may appear any number of times between any two terminals and at the
start and end of the text. Terminal regexes go through ``parse_terminal_regex`` (so ``\\d``/``\\w``
are ASCII, see ``grammars.frontends.regex``; anchors fail closed). Terminal flags ``i`` and ``s``
are honoured; ``m``, ``x``, ``u``, ``l`` fail closed, as do ``%declare``d terminals (no pattern).

A terminal's language is its regex's full-match language. Lark's own dynamic lexer only tries
the leftmost-first match (and its prefixes), so a lazy ``.*?`` stops at the first delimiter
there; for the standard library's ``ESCAPED_STRING`` (which also needs a lookbehind) and
``C_COMMENT`` we substitute the delimiter-respecting regex Lark effectively lexes. Other lazy
or order-dependent terminal regexes are taken at their full-match language.
"""

from __future__ import annotations

import re
import sys
from typing import Iterable

from lark.exceptions import LarkError, UnexpectedInput
from lark.grammar import Rule, Symbol
from lark.lexer import PatternStr, TerminalDef
from lark.load_grammar import GrammarBuilder

from grammars.errors import GrammarSyntaxError, LimitExceeded, UnsupportedGrammarError
from grammars.frontends.regex import parse_terminal_regex
from grammars.ir import Expr, Grammar, Literal, Ref, alt, repeat, seq

__all__ = ["parse_lark", "IGNORE_RULE"]

#: the rule holding ``%ignore``d terminals; Lark cannot produce this name for a rule or terminal
IGNORE_RULE = "__ignore__"

#: Lark standard-library terminals whose regexes rely on lookbehind or on Lark's leftmost-first
#: matching of lazy quantifiers, mapped to the language Lark actually lexes with them.
_KNOWN_IDIOMS = {
    # common.ESCAPED_STRING: up to the first quote not escaped by a backslash
    r'".*?(?<!\\)(\\\\)*?"': r'"(?:[^"\\\n]|\\.)*"',
    # common.C_COMMENT: up to the first "*/"
    "/\\*(.|\n)*?\\*/": r"/\*(?:[^*]|\*+[^*/])*\*+/",
}

_LINE_COLUMN = re.compile(r"at line (\d+) column (\d+)")
_LINE_COLUMN_SUFFIX = re.compile(r",?\s*at line \d+,? column \d+.*$")
_QUOTED_NAME = re.compile(r"'([A-Za-z_][A-Za-z_0-9]*)'")


def parse_lark(text: str, *, start: str = "start", source: str = "<lark>") -> Grammar:
    """Parse a Lark grammar into a ``Grammar`` whose start rule is ``start``.

    Lark's own errors become ``GrammarSyntaxError`` with line and column where Lark reports
    them (else the first mention of the offending name); constructs with no exact
    character-level meaning raise ``UnsupportedGrammarError``. ``TypeError`` when ``text``,
    ``start`` or ``source`` is not a str.
    """
    for name, value in (("text", text), ("start", start), ("source", source)):
        if not isinstance(value, str):
            raise TypeError(f"parse_lark: {name} must be a str, got {type(value).__name__}")
    terminal_defs, rules, ignore = _compile(text, start, source)
    terminals = {str(t.name): _terminal_expr(t, source) for t in terminal_defs}
    ignored = [_terminal_ref(name, terminals) for name in ignore]
    bodies = _rule_bodies(rules, terminals, bool(ignored))
    if start not in bodies:
        raise GrammarSyntaxError(f"start rule {start!r} is not defined", text, 0, source=source)
    out: dict[str, Expr] = {}
    if ignored:
        out[IGNORE_RULE] = repeat(alt(ignored))
        bodies[start] = seq([Ref(IGNORE_RULE), bodies[start]])
    out.update(bodies)
    out.update(terminals)
    return Grammar.of(out, start, source)


def _compile(text: str, start: str, source: str) -> tuple[list[TerminalDef], list[Rule], list[str]]:
    """Run Lark's loader and compiler, mapping its exceptions onto ours."""
    try:
        builder = GrammarBuilder()
        builder.load_grammar(text, source)
        return builder.build().compile([start], ())
    except UnexpectedInput as err:
        offset = _offset(text, err.line, err.column)
        raise GrammarSyntaxError(_first_line(err), text, offset, source=source) from err
    except LarkError as err:
        offset = _error_offset(text, str(err))
        raise GrammarSyntaxError(_first_line(err), text, offset, source=source) from err
    except OSError as err:  # an %import whose file does not exist
        offset = max(0, text.find("%import"))
        raise GrammarSyntaxError(f"cannot import: {err}", text, offset, source=source) from err
    except RecursionError:  # Lark's loader recurses once per level of nested parentheses
        raise LimitExceeded("recursion", sys.getrecursionlimit(),
                            "the Lark grammar nests expressions too deeply for Lark's loader (Python's "
                            f"recursion limit {sys.getrecursionlimit()} was reached)") from None


def _first_line(err: Exception) -> str:
    """Lark's message without its context lines or position (ours renders both)."""
    line = str(err).strip().split("\n", 1)[0]
    return _LINE_COLUMN_SUFFIX.sub("", line).strip() or type(err).__name__


def _error_offset(text: str, message: str) -> int:
    """Where Lark's message says the error is: its line/column, else the first mention of a name."""
    where = _LINE_COLUMN.search(message)
    if where:
        return _offset(text, int(where.group(1)), int(where.group(2)))
    name = _QUOTED_NAME.search(message)
    if name:
        mention = re.search(rf"(?<![\w.]){re.escape(name.group(1))}(?!\w)", text)
        if mention:
            return mention.start()
    return 0


def _offset(text: str, line: int, column: int) -> int:
    """0-based offset of a 1-based line and column."""
    line_start = 0
    for _ in range(max(0, line - 1)):
        nxt = text.find("\n", line_start)
        if nxt < 0:
            return len(text)
        line_start = nxt + 1
    return min(len(text), line_start + max(0, column - 1))


def _terminal_expr(terminal: TerminalDef, source: str) -> Expr:
    pattern = terminal.pattern
    unknown = sorted(set(pattern.flags) - {"i", "s"})
    if unknown:
        raise UnsupportedGrammarError(
            f"terminal {terminal.name}: unsupported regex flag(s) {''.join(unknown)!r} (supported: 'i', 's')"
        )
    flags = "".join(sorted(pattern.flags))
    if isinstance(pattern, PatternStr):
        if not flags:
            return Literal(pattern.value)
        regex = re.escape(pattern.value)
    else:
        regex = _KNOWN_IDIOMS.get(pattern.value, pattern.value)
    return parse_terminal_regex(regex, flags=flags, source=f"{source}: terminal {terminal.name}")


def _terminal_ref(name: str, terminals: dict[str, Expr]) -> Ref:
    if name not in terminals:
        raise UnsupportedGrammarError(f"terminal {name} has no pattern (%declare): its language is unknown")
    return Ref(name)


def _rule_bodies(rules: Iterable[Rule], terminals: dict[str, Expr], ignoring: bool) -> dict[str, Expr]:
    """One ``Alt`` per rule name; each terminal use is followed by the ignore rule when ignoring."""
    expansions: dict[str, list[Expr]] = {}
    for rule in rules:
        items = [_symbol(sym, terminals, ignoring) for sym in rule.expansion]
        expansions.setdefault(str(rule.origin.name), []).append(seq(items))
    for rule in rules:
        for sym in rule.expansion:
            if not sym.is_term and sym.name not in expansions:
                raise UnsupportedGrammarError(
                    f"rule {sym.name} has no definition (%declare): its language is unknown"
                )
    return {name: alt(bodies) for name, bodies in expansions.items()}


def _symbol(sym: Symbol, terminals: dict[str, Expr], ignoring: bool) -> Expr:
    if not sym.is_term:
        return Ref(str(sym.name))
    ref = _terminal_ref(str(sym.name), terminals)
    return seq([ref, Ref(IGNORE_RULE)]) if ignoring else ref
