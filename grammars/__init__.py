"""corral.grammars — WHAT IS ALLOWED.

Grammars, regular expressions (and, later, JSON Schemas) compile into token-mask automata for a
real tokenizer vocabulary::

    vocab = TokenVocabulary.from_pretrained("tokenizer_dir_or.gguf")
    grammar = compile_gbnf(text, vocab)           # or compile_regex / compile_lark
    matcher = grammar.matcher()                   # one per generated sequence
    mask = allocate_token_bitmask(1, vocab.logits_width)
    matcher.fill_mask(mask, 0)                    # bit i set: token i may come next
    matcher.advance(token)                        # raises TokenRejected if it may not

Pure Python + numpy (+ numba for the trie walks); no torch in this package.
"""

from grammars.bitmask import allocate_token_bitmask
from grammars.builtin import builtin_grammar
from grammars.compile import (
    CompiledGrammar,
    Compiler,
    compile_gbnf,
    compile_grammar,
    compile_json_schema,
    compile_lark,
    compile_regex,
    shared_compiler,
)
from grammars.errors import (
    ConstraintError,
    EmptyLanguageError,
    GrammarError,
    GrammarSyntaxError,
    LimitExceeded,
    MatchError,
    NoAllowedToken,
    RollbackError,
    TokenRejected,
    UnsupportedGrammarError,
    UnsupportedSchemaError,
    VocabularyError,
)
from grammars.frontends import parse_gbnf, parse_lark, parse_regex
from grammars.ir import Grammar
from grammars.limits import Limits
from grammars.masks.token_dfa import DFAMatcher, TokenDFA
from grammars.matcher import Matcher, TokenCheck, TokenMatcher, UnconstrainedMatcher
from grammars.vocab.vocabulary import TokenVocabulary

__all__ = [
    "TokenVocabulary",
    "Grammar",
    "compile_regex",
    "compile_lark",
    "compile_gbnf",
    "compile_grammar",
    "compile_json_schema",
    "Compiler",
    "CompiledGrammar",
    "shared_compiler",
    "TokenMatcher",
    "Matcher",
    "DFAMatcher",
    "UnconstrainedMatcher",
    "TokenCheck",
    "TokenDFA",
    "Limits",
    "allocate_token_bitmask",
    "parse_regex",
    "parse_gbnf",
    "parse_lark",
    "builtin_grammar",
    "ConstraintError",
    "GrammarError",
    "GrammarSyntaxError",
    "UnsupportedGrammarError",
    "UnsupportedSchemaError",
    "EmptyLanguageError",
    "VocabularyError",
    "LimitExceeded",
    "MatchError",
    "TokenRejected",
    "RollbackError",
    "NoAllowedToken",
]
