"""Finite automata for the lexer: regular IR expressions as minimal byte-level DFAs."""

from .byte_dfa import DEAD, ByteDFA, compile_regular, concat, nonempty, union
from .utf8 import utf8_ranges, utf8_sequences

__all__ = [
    "DEAD",
    "ByteDFA",
    "compile_regular",
    "nonempty",
    "union",
    "concat",
    "utf8_ranges",
    "utf8_sequences",
]
