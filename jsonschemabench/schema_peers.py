"""JSON Schema adapters for corral and its peers (llguidance, xgrammar, outlines-core), one shape.

The MaskBench and Test Suite runners drive every engine through the same operations, so the
timing loop cannot favour one of them::

    handle = engine.compile(schema)         # raises PeerCompileError when the engine refuses it
    m = engine.matcher(handle)              # a fresh per-sequence matcher
    mask = engine.fill_mask(m)              # packed int32 row, bit i = token i allowed
    engine.allowed(mask, token) -> bool     # read one bit (never timed)
    engine.advance(m, token) -> bool        # False when the engine rejects the token
    engine.is_accepting(m) -> bool          # the engine's own "may stop here"
    engine.version, engine.options          # recorded next to every result

``schema`` is the decoded JSON value (a dict, or ``True``/``False`` for boolean schemas); each
adapter hands it to its engine in the form the engine takes. ``fill_mask`` returns the adapter's
own buffer, valid until the next call. ``reset_caches()`` is called (untimed) before each
schema's compilation so that no compiled grammar is carried from one file to the next.

Options are each engine's natural defaults except where noted, and are recorded in ``options``:

- corral: ``Compiler(vocab).compile_json_schema(schema, whitespace="flexible")``; a fresh
  ``Compiler`` per schema (built before the clock starts), so neither its compiled-grammar LRU
  nor its token-walk cache carries work from one file to the next.
- llguidance: ``LLMatcher.grammar_from_json_schema(schema)`` with its defaults (flexible
  whitespace ``[\\x20\\x0A\\x0D\\x09]+``, ``lenient`` off, ``coerce_one_of`` off), then
  ``LLMatcher(tokenizer, grammar)``. The matcher never raises for a bad grammar: it enters an
  error state, which the adapter turns into ``PeerCompileError``. llguidance has no
  cross-grammar cache.
- xgrammar: ``GrammarCompiler(info, max_threads=1, cache_enabled=False)`` and
  ``compile_json_schema(schema, any_whitespace=True, strict_mode=False)`` — MaskBench's
  "compliant" mode; the default ``strict_mode=True`` forbids properties and items the schema
  does not list, against the spec. Unsupported keywords are logged and *ignored* by xgrammar
  (no error), so they show up as invalidation errors, not compile errors.
- outlines-core: ``build_regex_from_schema(json.dumps(schema))`` (whitespace ``[ ]?``,
  recursion unrolled to depth 3), ``Index(regex, vocabulary)`` and ``Guide(index)``. Its
  ``Vocabulary`` is built from the exact token bytes (``Vocabulary.from_pretrained`` needs the
  Hugging Face Hub) with the tokenizer's EOS; special tokens are left out.

Adapters import their engine lazily, so this module imports without any peer installed;
constructing one raises ``EngineUnavailable`` when its package is missing. ``load_engine`` also
accepts ``"module:factory"`` specs (the unit tests' fake engines).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
from typing import Any, Callable, Protocol

import numpy as np

from .peers import BenchTokenizer, EngineUnavailable, bit_is_set, load_tokenizer

__all__ = [
    "PeerCompileError",
    "EngineUnavailable",
    "SchemaEngine",
    "CorralSchemaEngine",
    "LLGuidanceSchemaEngine",
    "XGrammarSchemaEngine",
    "OutlinesSchemaEngine",
    "SCHEMA_ENGINES",
    "ENGINE_MODULES",
    "engine_installed",
    "load_engine",
    "load_bench_tokenizer",
    "warm_up",
]


class PeerCompileError(Exception):
    """The engine would not compile this schema; ``kind`` names the engine's error class.

    ``keyword`` and ``pointer`` are filled when the engine says which keyword it refused
    (corral's ``UnsupportedSchemaError``).
    """

    def __init__(self, message: str, *, kind: str = "", keyword: str | None = None, pointer: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.keyword = keyword
        self.pointer = pointer


class SchemaEngine(Protocol):
    """What the runners need from an engine; see the module docstring."""

    name: str
    version: str
    options: dict
    eos_token_ids: tuple[int, ...]

    def reset_caches(self) -> None: ...

    def compile(self, schema: Any) -> Any: ...

    def matcher(self, handle: Any) -> Any: ...

    def fill_mask(self, m: Any) -> np.ndarray: ...

    def allowed(self, mask: np.ndarray, token: int) -> bool: ...

    def advance(self, m: Any, token: int) -> bool: ...

    def is_accepting(self, m: Any) -> bool: ...


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "dev" if dist == "corral" else "unknown"


def _message(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else text
    # xgrammar prefixes "[time] file.cc:820: "
    if first.startswith("[") and "] " in first:
        head, _, rest = first.partition("] ")
        if ".cc:" in rest[:80]:
            rest = rest.split(": ", 1)[-1]
        first = rest or first
    return first[:limit]


class CorralSchemaEngine:
    """corral's ``Compiler.compile_json_schema`` and ``Matcher``."""

    name = "corral"

    def __init__(self, tokenizer: BenchTokenizer, *, whitespace: str = "flexible"):
        try:
            from grammars import (
                Compiler,
                GrammarError,
                LimitExceeded,
                TokenRejected,
                UnsupportedSchemaError,
                allocate_token_bitmask,
            )
        except ImportError as exc:
            raise EngineUnavailable(f"corral's grammars API is not importable ({exc})") from exc
        if tokenizer.vocab is None:
            raise EngineUnavailable("corral could not load the vocabulary (TokenVocabulary)")
        self._vocab = tokenizer.vocab
        self._Compiler = Compiler
        self._refusals = (GrammarError, LimitExceeded)
        self._unsupported = UnsupportedSchemaError
        self._rejected = TokenRejected
        self._compiler = Compiler(self._vocab)  # builds the vocabulary index once (~1 s)
        self._mask = allocate_token_bitmask(1, self._vocab.logits_width)
        self._whitespace = whitespace
        self.eos_token_ids = tuple(sorted(int(t) for t in self._vocab.eos_token_ids))
        self.version = _version("corral")
        self.options = {
            "call": f"Compiler(vocab).compile_json_schema(schema, whitespace={whitespace!r})",
            "whitespace": whitespace,
            "cache": "fresh Compiler per schema (no compiled grammar or token walk carried across files)",
        }

    def reset_caches(self) -> None:
        self._compiler = self._Compiler(self._vocab)

    def compile(self, schema: Any) -> Any:
        try:
            return self._compiler.compile_json_schema(schema, whitespace=self._whitespace)
        except self._unsupported as exc:
            raise PeerCompileError(_message(exc), kind=type(exc).__name__, keyword=exc.keyword,
                                   pointer=exc.pointer) from exc
        except self._refusals as exc:
            raise PeerCompileError(_message(exc), kind=type(exc).__name__) from exc
        except ImportError as exc:  # the JSON Schema front end has not landed in this checkout
            raise PeerCompileError(f"JSON Schema front end not available: {exc}", kind="ImportError") from exc

    def matcher(self, handle: Any) -> Any:
        return handle.matcher()

    def fill_mask(self, m: Any) -> np.ndarray:
        m.fill_mask(self._mask, 0)
        return self._mask

    def allowed(self, mask: np.ndarray, token: int) -> bool:
        return bit_is_set(mask, token)

    def advance(self, m: Any, token: int) -> bool:
        try:
            m.advance(token)
        except self._rejected:
            return False
        return True

    def is_accepting(self, m: Any) -> bool:
        return bool(m.is_accepting())


class LLGuidanceSchemaEngine:
    """llguidance's ``LLMatcher`` over ``grammar_from_json_schema`` (defaults)."""

    name = "llguidance"

    def __init__(self, tokenizer: BenchTokenizer):
        try:
            import llguidance
            import llguidance.hf
            import llguidance.numpy
        except ImportError as exc:
            raise EngineUnavailable(f"llguidance is not installed ({exc})") from exc
        self._llg = llguidance
        self._fill = llguidance.numpy.fill_next_token_bitmask
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer.hf)
        self._mask = llguidance.numpy.allocate_token_bitmask(1, self._tokenizer.vocab_size)
        eos = tokenizer.hf.eos_token_id
        self.eos_token_ids = (int(eos),) if eos is not None else ()
        self.version = llguidance.__version__
        self.options = {
            "call": "LLMatcher(llguidance.hf.from_tokenizer(hf), LLMatcher.grammar_from_json_schema(schema))",
            "json_options": "defaults (whitespace_flexible, not lenient, no coerce_one_of)",
            "cache": "none across grammars",
        }

    def reset_caches(self) -> None:
        pass

    def compile(self, schema: Any) -> Any:
        try:
            grammar = self._llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        except ValueError as exc:
            raise PeerCompileError(_message(exc), kind=type(exc).__name__) from exc
        pristine = self._llg.LLMatcher(self._tokenizer, grammar, log_level=0)
        if pristine.is_error():
            raise PeerCompileError(_message(Exception(pristine.get_error())), kind="LLMatcher error")
        return pristine

    def matcher(self, handle: Any) -> Any:
        return handle.deep_copy()

    def fill_mask(self, m: Any) -> np.ndarray:
        self._fill(m, self._mask, 0)
        return self._mask

    def allowed(self, mask: np.ndarray, token: int) -> bool:
        return bit_is_set(mask, token)

    def advance(self, m: Any, token: int) -> bool:
        return bool(m.consume_token(token))

    def is_accepting(self, m: Any) -> bool:
        return bool(m.is_accepting())


class XGrammarSchemaEngine:
    """xgrammar's ``compile_json_schema`` in compliant mode (any whitespace, not strict)."""

    name = "xgrammar"

    def __init__(self, tokenizer: BenchTokenizer):
        try:
            import xgrammar
        except ImportError as exc:
            raise EngineUnavailable(f"xgrammar is not installed ({exc})") from exc
        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer.hf)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._mask_tensor = xgrammar.allocate_token_bitmask(1, info.vocab_size)
        self._mask = self._mask_tensor.numpy()  # shares memory with the tensor
        self.eos_token_ids = tuple(int(t) for t in info.stop_token_ids)
        self.version = _version("xgrammar")
        self.options = {
            "call": "GrammarCompiler(info, max_threads=1, cache_enabled=False)"
                    ".compile_json_schema(schema, any_whitespace=True, strict_mode=False)",
            "any_whitespace": True,
            "strict_mode": False,
            "cache": "disabled (cache_enabled=False)",
        }

    def reset_caches(self) -> None:
        pass

    def compile(self, schema: Any) -> Any:
        try:
            return self._compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=False)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses from C++
            raise PeerCompileError(_message(exc), kind=type(exc).__name__) from exc

    def matcher(self, handle: Any) -> Any:
        return self._xgr.GrammarMatcher(handle)

    def fill_mask(self, m: Any) -> np.ndarray:
        m.fill_next_token_bitmask(self._mask_tensor, 0)
        return self._mask

    def allowed(self, mask: np.ndarray, token: int) -> bool:
        return bit_is_set(mask, token)

    def advance(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))

    def is_accepting(self, m: Any) -> bool:
        return bool(m.is_completed())


class OutlinesSchemaEngine:
    """outlines-core: schema → regex → ``Index`` (token DFA) → ``Guide``."""

    name = "outlines"

    def __init__(self, tokenizer: BenchTokenizer):
        try:
            import outlines_core
            from outlines_core.json_schema import build_regex_from_schema
            from outlines_core.kernels.numpy import allocate_token_bitmask, fill_next_token_bitmask
        except ImportError as exc:
            raise EngineUnavailable(f"outlines-core is not installed ({exc})") from exc
        eos = tokenizer.hf.eos_token_id
        if eos is None:
            raise EngineUnavailable("outlines-core needs an EOS token id")
        token_bytes = _token_bytes(tokenizer)
        skip = {int(eos)}
        if tokenizer.vocab is not None:
            skip |= set(tokenizer.vocab.special_token_ids)
        table: dict[bytes, list[int]] = {}
        for token_id, piece in enumerate(token_bytes):
            if piece and token_id not in skip:
                table.setdefault(piece, []).append(token_id)
        self._oc = outlines_core
        self._regex = build_regex_from_schema
        self._fill = fill_next_token_bitmask
        self._vocabulary = outlines_core.Vocabulary(int(eos), table)
        self._mask = allocate_token_bitmask(len(token_bytes))
        self.eos_token_ids = (int(eos),)
        self.version = _version("outlines_core")
        self.options = {
            "call": "Guide(Index(build_regex_from_schema(json.dumps(schema)), Vocabulary(eos, token_bytes)))",
            "whitespace_pattern": "default ([ ]?)",
            "max_recursion_depth": "default (3)",
            "cache": "none across grammars",
        }

    def reset_caches(self) -> None:
        pass

    def compile(self, schema: Any) -> Any:
        try:
            regex = self._regex(json.dumps(schema))
            return self._oc.Index(regex, self._vocabulary)
        except Exception as exc:  # PyO3 surfaces Rust errors as ValueError/TypeError/...
            raise PeerCompileError(_message(exc), kind=type(exc).__name__) from exc

    def matcher(self, handle: Any) -> Any:
        return self._oc.Guide(handle)

    def fill_mask(self, m: Any) -> np.ndarray:
        self._fill(m, self._mask)
        return self._mask

    def allowed(self, mask: np.ndarray, token: int) -> bool:
        return bit_is_set(mask, token)

    def advance(self, m: Any, token: int) -> bool:
        try:
            m.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True

    def is_accepting(self, m: Any) -> bool:
        return bool(m.is_finished())


def _token_bytes(tokenizer: BenchTokenizer) -> tuple[bytes, ...]:
    """Exact bytes per token id: corral's vocabulary when loaded, else derived from ``hf``."""
    if tokenizer.vocab is not None:
        return tuple(tokenizer.vocab.token_bytes)
    from grammars import TokenVocabulary

    return tuple(TokenVocabulary.from_tokenizer(tokenizer.hf).token_bytes)


SCHEMA_ENGINES: dict[str, Callable[[BenchTokenizer], SchemaEngine]] = {
    "corral": CorralSchemaEngine,
    "llguidance": LLGuidanceSchemaEngine,
    "xgrammar": XGrammarSchemaEngine,
    "outlines": OutlinesSchemaEngine,
}

#: the importable module each engine needs (checked before a run, without importing it)
ENGINE_MODULES = {"corral": "grammars", "llguidance": "llguidance", "xgrammar": "xgrammar",
                  "outlines": "outlines_core"}


def engine_installed(spec: str) -> bool:
    """Whether the package behind ``spec`` can be imported (``module:factory`` specs: always)."""
    module = ENGINE_MODULES.get(spec)
    return module is None or importlib.util.find_spec(module) is not None


def resolve(spec: str) -> Any:
    """The object named by ``"package.module:attribute"``."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"expected 'module:attribute', got {spec!r}")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def load_engine(spec: str, tokenizer: Any) -> SchemaEngine:
    """The engine named ``spec`` (a key of ``SCHEMA_ENGINES`` or a ``module:factory``)."""
    if spec in SCHEMA_ENGINES:
        return SCHEMA_ENGINES[spec](tokenizer)
    if ":" in spec:
        return resolve(spec)(tokenizer)
    raise ValueError(f"unknown engine {spec!r}; choose from {', '.join(SCHEMA_ENGINES)} or give module:factory")


def load_bench_tokenizer(path: str) -> BenchTokenizer:
    """The tokenizer every engine is built from; instances are encoded with its ``encode``."""
    return load_tokenizer(path, use_corral=True)


def warm_up(engine: SchemaEngine) -> None:
    """Compile and mask a trivial schema once, so one-time set-up is not charged to a file."""
    try:
        m = engine.matcher(engine.compile({"type": "integer"}))
    except PeerCompileError:
        return
    engine.fill_mask(m)
    engine.reset_caches()
