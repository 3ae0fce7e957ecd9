"""From a request's constraint fields to a ``CompiledGrammar``: specs, bounds, a compile cache.

A request names at most one constraint (``response_format``, ``structured_outputs``, or forced
``tools``); ``ConstraintSpec`` is its canonical, hashable form — kind, source text, options. Before
anything compiles, ``check_bounds`` refuses oversized or over-nested input (422).

``CompileService`` compiles off the event loop in a small thread pool, behind a bounded LRU
cache keyed by the spec *and the vocabulary fingerprint*. Concurrent requests for one spec share
one compilation (single flight); failures are cached too (a hostile schema is refused once per
cache lifetime, not recompiled per request). Each wait is bounded by ``compile_timeout_s``: past
it the request answers 422 while the compilation finishes in the background and lands in the
cache (the grammar engine has no cooperative deadline for compilation, see the report in
``server/__init__.py``; ``grammars.Limits`` bounds its work instead).

Compile errors keep their type on the wire (``error_for``): an unsupported JSON Schema keyword is
a 400 with code ``unsupported_schema`` naming the keyword and its JSON pointer, a grammar syntax
error a 400 with line and column, a grammar that accepts nothing a 400, a ``LimitExceeded`` or
a timeout a 422.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from grammars import (
    CompiledGrammar,
    Compiler,
    EmptyLanguageError,
    GrammarError,
    GrammarSyntaxError,
    LimitExceeded,
    UnsupportedGrammarError,
    UnsupportedSchemaError,
    allocate_token_bitmask,
)
from grammars.ir import Grammar, alt, literal
from server.protocol import ApiError

__all__ = ["ConstraintSpec", "CompileService", "detect_grammar_syntax", "check_bounds", "error_for", "schema_spec"]

log = logging.getLogger("server.constraints")


@dataclass(frozen=True)
class ConstraintSpec:
    """A constraint in canonical form. ``kind``: ``json_schema`` (``source`` is compact JSON, keys
    in the order given: property order is part of the constraint),
    ``regex``, ``gbnf``, ``lark`` or ``choice`` (``source`` a JSON list of strings); ``options``
    sorted (name, value) pairs for the JSON Schema front end; ``param`` the request field it came
    from (for error messages; not part of the identity)."""

    kind: str
    source: str
    options: tuple[tuple[str, Any], ...] = ()
    param: str = ""

    @property
    def key(self) -> tuple:
        return (self.kind, self.source, self.options)


def schema_spec(schema: Any, param: str, *, whitespace: str | None = None, lenient: bool = False) -> ConstraintSpec:
    """A JSON Schema (dict, bool or JSON text) as a spec; 400 when JSON text does not parse."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ApiError(400, f"{param} is not valid JSON: {exc}", param=param, code="invalid_schema") from None
        except RecursionError:
            raise ApiError(422, f"{param} is nested too deeply", param=param, code="constraint_too_complex") from None
    if not isinstance(schema, (dict, bool)):
        raise ApiError(400, f"{param} must be a JSON Schema object or boolean, got {type(schema).__name__}",
                       param=param, code="invalid_schema")
    try:
        # key order is kept: it is the order in which properties are generated ("schema" order)
        source = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        raise ApiError(422, f"{param} is nested too deeply", param=param, code="constraint_too_complex") from None
    options = {}
    if whitespace is not None:
        options["whitespace"] = whitespace
    if lenient:
        options["lenient"] = True
    return ConstraintSpec("json_schema", source, tuple(sorted(options.items())), param)


_GBNF_RULE = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_-]*\s*::=", re.MULTILINE)
_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][A-Za-z0-9_]*(\.-?\d+)?\s*:(?!:)", re.MULTILINE)
_LARK_DIRECTIVE = re.compile(r"^\s*%(import|ignore|declare|override|extend)\b", re.MULTILINE)


def detect_grammar_syntax(text: str, param: str = "structured_outputs.grammar") -> str:
    """``"gbnf"`` (rules written ``name ::= ...``) or ``"lark"`` (``name: ...``, ``%import``);
    raises ``ApiError`` 400 when neither fits."""
    if _GBNF_RULE.search(text):
        return "gbnf"
    if _LARK_RULE.search(text) or _LARK_DIRECTIVE.search(text):
        return "lark"
    raise ApiError(400, "cannot tell the grammar's syntax: write GBNF rules as 'root ::= ...' or Lark rules as "
                   "'start: ...'", param=param, code="invalid_grammar")


def _depth_and_size(value: Any, limit_depth: int) -> tuple[int, int]:
    """Nesting depth and node count of a JSON value (iterative: no recursion on hostile input)."""
    deepest, nodes = 0, 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        nodes += 1
        deepest = max(deepest, depth)
        if depth > limit_depth:
            return deepest, nodes
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest, nodes


def check_bounds(spec: ConstraintSpec, *, max_bytes: int, max_depth: int, max_choices: int) -> None:
    """422 ``constraint_too_complex`` when a constraint is bigger or deeper than the server takes."""
    size = len(spec.source.encode("utf-8"))
    if size > max_bytes:
        raise ApiError(422, f"{spec.param} is {size} bytes; this server compiles constraints of at most {max_bytes} "
                       "bytes", param=spec.param, code="constraint_too_complex")
    if spec.kind in ("json_schema", "choice"):
        depth, _ = _depth_and_size(json.loads(spec.source), max_depth)
        if depth > max_depth:
            raise ApiError(422, f"{spec.param} is nested more than {max_depth} levels deep", param=spec.param,
                           code="constraint_too_complex")
    if spec.kind == "choice" and len(json.loads(spec.source)) > max_choices:
        raise ApiError(422, f"{spec.param} lists more than {max_choices} choices", param=spec.param,
                       code="constraint_too_complex")


def error_for(exc: BaseException, param: str | None) -> ApiError:
    """A compile failure as the API error clients see (status, code, and where it points)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, UnsupportedSchemaError):
        return ApiError(400, f"{param}: unsupported JSON Schema keyword {exc.keyword!r} at {exc.pointer}"
                        + (f": {exc.reason}" if exc.reason else ""), param=param, code="unsupported_schema")
    if isinstance(exc, GrammarSyntaxError):
        return ApiError(400, f"{param}: syntax error at line {exc.line} column {exc.column}: {exc.message}",
                        param=param, code="grammar_syntax_error")
    if isinstance(exc, EmptyLanguageError):
        return ApiError(400, f"{param}: the constraint accepts no output at all: {exc}", param=param,
                        code="empty_language")
    if isinstance(exc, UnsupportedGrammarError):
        return ApiError(400, f"{param}: {exc}", param=param, code="unsupported_grammar")
    if isinstance(exc, GrammarError):
        return ApiError(400, f"{param}: {exc}", param=param, code="invalid_constraint")
    if isinstance(exc, LimitExceeded):
        return ApiError(422, f"{param}: the constraint is too complex for this server ({exc})", param=param,
                        code="constraint_too_complex")
    if isinstance(exc, RecursionError):
        return ApiError(422, f"{param}: the constraint is nested too deeply to compile", param=param,
                        code="constraint_too_complex")
    if isinstance(exc, (TypeError, ValueError)):
        return ApiError(400, f"{param}: {exc}", param=param, code="invalid_constraint")
    return ApiError(422, f"{param}: the constraint could not be compiled ({type(exc).__name__}: {exc})",
                    param=param, code="constraint_compile_failed")


class CompileService:
    """Compiles ``ConstraintSpec``s for one ``Compiler``: thread pool, single flight, LRU, budget."""

    def __init__(self, compiler: Compiler, *, cache_size: int = 256, timeout_s: float = 10.0, workers: int = 2):
        self.compiler = compiler
        self.fingerprint = compiler.vocab.fingerprint
        self.timeout_s = float(timeout_s)
        self._cache_size = int(cache_size)
        self._cache: OrderedDict[tuple, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="corral-compile")
        self.hits = 0
        self.misses = 0
        self.timeouts = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._cache), "hits": self.hits, "misses": self.misses, "timeouts": self.timeouts}

    def submit(self, spec: ConstraintSpec) -> Future:
        """The (shared) future of ``spec``'s compilation; starts it when it is not cached."""
        key = spec.key + (self.fingerprint,)
        with self._lock:
            fut = self._cache.get(key)
            if fut is not None and not fut.cancelled():
                self._cache.move_to_end(key)
                self.hits += 1
                return fut
            self.misses += 1
            fut = self._pool.submit(self._compile, spec)
            self._cache[key] = fut
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return fut

    async def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        """Await ``spec``'s grammar within the budget; raises ``ApiError`` (400/422) otherwise."""
        fut = self.submit(spec)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), self.timeout_s)
        except asyncio.TimeoutError:
            with self._lock:
                self.timeouts += 1
            raise ApiError(422, f"{spec.param}: compiling the constraint took longer than the server's budget of "
                           f"{self.timeout_s:g} s", param=spec.param, code="compile_timeout") from None
        except ApiError:
            raise
        except Exception as exc:  # noqa: BLE001 - every compile failure becomes a typed 4xx
            if not isinstance(exc, (GrammarError, LimitExceeded, TypeError, ValueError, RecursionError)):
                log.warning("compiling %s failed unexpectedly", spec.param, exc_info=exc)
            raise error_for(exc, spec.param) from None

    def compile_sync(self, spec: ConstraintSpec) -> CompiledGrammar:
        """The blocking form (worker threads, tests): the cached result or a fresh compile."""
        fut = self.submit(spec)
        try:
            return fut.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise ApiError(422, f"{spec.param}: compiling took longer than {self.timeout_s:g} s",
                           param=spec.param, code="compile_timeout") from None
        except ApiError:
            raise
        except Exception as exc:  # noqa: BLE001 - as in compile()
            raise error_for(exc, spec.param) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- in the pool -----------------------------------------------------------------------------

    def _compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        t0 = time.perf_counter()
        c = self.compiler
        if spec.kind == "json_schema":
            compiled = c.compile_json_schema(spec.source, **dict(spec.options))
        elif spec.kind == "regex":
            compiled = c.compile_regex(spec.source)
        elif spec.kind == "gbnf":
            compiled = c.compile_gbnf(spec.source)
        elif spec.kind == "lark":
            compiled = c.compile_lark(spec.source)
        elif spec.kind == "choice":
            choices = json.loads(spec.source)
            compiled = c.compile_grammar(Grammar.of({"root": alt([literal(x) for x in choices])}, "root", "<choice>"))
        else:  # pragma: no cover - specs are built by this package
            raise ValueError(f"unknown constraint kind {spec.kind!r}")
        if compiled.accepts_nothing:
            raise EmptyLanguageError("the constraint accepts no output at all")
        # what the first step needs, computed here rather than in the batch: the first mask and
        # the closing tables (budget-aware closing asks for the shortest completion at once)
        matcher = compiled.matcher()
        matcher.fill_mask(allocate_token_bitmask(1, c.vocab.logits_width), 0)
        matcher.shortest_completion()
        log.debug("compiled %s (%s) in %.3f s", spec.param, spec.kind, time.perf_counter() - t0)
        return compiled
