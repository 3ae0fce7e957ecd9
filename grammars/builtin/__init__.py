"""Built-in grammars: Lark source text shipped with corral, ready for ``compile_lark``::

    from grammars import builtin_grammar, compile_lark
    grammar = compile_lark(builtin_grammar("cpp"), vocab)

* ``"cpp"``: C++ as HumanEval-style solutions write it (``#include`` lines, ``using``,
  functions, templates and STL types, every statement, expressions with C++ precedence, lambdas,
  literals, comments, minimal ``struct``/``class``/``enum``). Its header comment lists the scope.
  It accepts a superset of what g++ accepts only where telling them apart needs name lookup or
  types (``a * b;``, a call with too few arguments), and rejects text whose tokens no C++ program
  has, including words run together (``returnx;`` is an identifier, never ``return x;``).
* ``"json"``: JSON (RFC 8259), any value at the top level.

The ``.lark`` files live beside this module (package data). This module only holds text: it
parses nothing and imports no other part of corral but its errors.
"""

from __future__ import annotations

import functools
from importlib.resources import files

from grammars.errors import GrammarError

__all__ = ["BUILTIN_GRAMMARS", "builtin_grammar"]

#: Names ``builtin_grammar`` knows.
BUILTIN_GRAMMARS: tuple[str, ...] = ("cpp", "json")


def builtin_grammar(name: str) -> str:
    """The Lark source text of the built-in grammar ``name`` (one of ``BUILTIN_GRAMMARS``).

    ``GrammarError`` (a ``ValueError``) naming the known grammars for an unknown name;
    ``TypeError`` when ``name`` is not a str.
    """
    if not isinstance(name, str):
        raise TypeError(f"builtin_grammar: name must be a str, got {type(name).__name__}")
    if name not in BUILTIN_GRAMMARS:
        raise GrammarError(f"unknown built-in grammar {name!r}; known: {', '.join(BUILTIN_GRAMMARS)}")
    return _read(name)


@functools.cache
def _read(name: str) -> str:
    return files(__name__).joinpath(f"{name}.lark").read_text(encoding="utf-8")
