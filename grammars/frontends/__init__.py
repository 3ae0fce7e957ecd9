"""Front ends: pure functions from grammar text (regex, GBNF, Lark) to the grammar IR.

None of them looks at a tokenizer; each fails closed (``UnsupportedGrammarError``) on constructs
it cannot represent exactly and reports malformed text as ``GrammarSyntaxError``.
"""

from grammars.frontends.gbnf import parse_gbnf
from grammars.frontends.lark import parse_lark
from grammars.frontends.regex import parse_regex

__all__ = ["parse_regex", "parse_gbnf", "parse_lark"]
