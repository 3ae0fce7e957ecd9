"""One adapter per engine — corral, llguidance, xgrammar, outlines-core — for every benchmark.

Every engine is wrapped in an adapter with the same operations, so no timing loop can favour
one of them::

    compiled = engine.compile(kind, source)   # kind "gbnf" | "regex" | "json_schema"; raises EngineRefused
    handle = engine.matcher(compiled)         # a fresh per-sequence matcher
    mask = engine.fill_mask(handle)           # packed int32 row, bit i = token i allowed
    engine.allowed(mask, token) -> bool       # read one bit (never timed)
    engine.advance(handle, token) -> bool     # False when the engine rejects the token
    engine.is_accepting(handle) -> bool       # the engine's own "may stop here"
    engine.reset_caches()                     # untimed, before each schema: nothing carried across files
    engine.name, engine.version, engine.options, engine.eos_token_ids

For ``"json_schema"`` the source is the decoded JSON value (a dict, or ``True``/``False``); for
the others, the grammar's text. ``fill_mask`` returns the adapter's own buffer, valid until the
next call. ``compile`` raises ``EngineRefused`` when an engine will not take a grammar or schema
(its message goes into the results; corral's also names the keyword and JSON pointer);
constructing an adapter raises ``EngineUnavailable`` when its package is not installed.
Adapters import their engine lazily, so this module imports without any peer installed.
``load_engine`` also accepts ``"module:factory"`` specs (the unit tests' fake engines).

Options are each engine's natural defaults except where noted, and are recorded in ``options``:

- corral: ``compile_gbnf``/``compile_regex``, and ``Compiler(vocab, allow_empty_language=True)
  .compile_json_schema(schema, **schema_options)`` with ``schema_options = {"whitespace":
  "flexible"}`` (MaskBench's instances have spaces after ``:`` and ``,``; a schema that accepts
  nothing, such as ``false``, gives a matcher that rejects every instance); ``reset_caches`` gives it a fresh ``Compiler``, so neither
  its compiled-grammar LRU nor its token-walk cache carries work from one file to the next (the
  process-wide table of byte automata, ``grammars.memo``, does: what schemas share, such as
  string bodies with the same bounds, keys and integer ranges, is built once per worker). A
  runner may set ``schema_options`` (the Test Suite runner adds its remote documents).
- llguidance: GBNF and regexes through ``llguidance.grammar_from(kind, text)`` — GBNF is
  converted (``gbnf_to_lark``) to its Lark dialect, which has a *greedy lexer*, so some strings
  of a character-level GBNF grammar are rejected (see ``samples.py``); schemas through
  ``LLMatcher.grammar_from_json_schema`` with its defaults (flexible whitespace, not lenient,
  no ``coerce_one_of``). ``LLMatcher(tokenizer, grammar)`` never raises for a bad grammar: it
  enters an error state, which the adapter turns into ``EngineRefused``. No cross-grammar cache.
- xgrammar: ``GrammarCompiler(info, max_threads=1, cache_enabled=False)``; GBNF read directly
  (byte-level Earley parser, root rule ``root``, GBNF's character-level semantics); schemas with
  ``compile_json_schema(schema, any_whitespace=True, strict_mode=False)`` — MaskBench's
  "compliant" mode (the default ``strict_mode=True`` forbids properties and items the schema does
  not list, against the spec). Unsupported keywords are logged and *ignored* by xgrammar (no
  error), so they show up as invalidation errors, not compile errors.
- outlines-core: regexes and ``build_regex_from_schema(json.dumps(schema))`` (whitespace
  ``[ ]?``, recursion unrolled to depth 3) through ``Index(regex, vocabulary)`` and
  ``Guide(index)``; no grammars. Its ``Vocabulary`` is built from the exact token bytes
  (``Vocabulary.from_pretrained`` needs the Hugging Face Hub) with the tokenizer's EOS; special
  tokens are left out.

Single-threaded timing needs ``RAYON_NUM_THREADS=1`` in the environment before llguidance is
first used; the runners set it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

import numpy as np

from .outputs import BENCH_INSTALL

__all__ = [
    "SourceKind",
    "EngineRefused",
    "EngineUnavailable",
    "BenchTokenizer",
    "Engine",
    "CorralEngine",
    "LLGuidanceEngine",
    "XGrammarEngine",
    "OutlinesEngine",
    "ENGINES",
    "ENGINE_MODULES",
    "engine_installed",
    "resolve",
    "load_engine",
    "load_tokenizer",
    "load_bench_tokenizer",
    "encode_continuation",
    "bit_is_set",
    "warm_up",
    "compile_schema",
]

SourceKind = Literal["gbnf", "regex", "json_schema"]


class EngineRefused(Exception):
    """The engine would not compile this grammar or schema; ``kind`` names the engine's error class.

    ``keyword`` and ``pointer`` are filled when the engine says which keyword it refused
    (corral's ``UnsupportedSchemaError``).
    """

    def __init__(self, message: str, *, kind: str = "", keyword: str | None = None, pointer: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.keyword = keyword
        self.pointer = pointer


class EngineUnavailable(Exception):
    """The engine's package (or the API it needs) is not importable in this environment."""


def bit_is_set(mask: np.ndarray, token: int) -> bool:
    """Whether bit ``token`` is set in a packed int32 mask row (bit ``t % 32`` of word ``t // 32``)."""
    word = token >> 5
    if word >= mask.shape[-1]:
        return False
    return bool((int(mask.reshape(-1)[word]) >> (token & 31)) & 1)


# --- the tokenizer every engine is built from ----------------------------------------------------


@dataclass
class BenchTokenizer:
    """The tokenizer every engine is built from, and the one encoding of every sample.

    ``vocab`` is corral's ``TokenVocabulary`` when corral can load it, else ``None``;
    ``hf`` is a transformers tokenizer (the peers need one). ``encode`` gives the canonical
    token ids of a text, without BOS or other special tokens.
    """

    path: Path
    hf: Any
    vocab: Any
    encode: Callable[[str], list[int]]
    encoder_name: str
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        stem = self.path.name
        if stem.endswith(".gguf"):
            stem = stem[: -len(".gguf")]
        return stem.removeprefix("ggml-vocab-")


def _load_hf_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{path}: expected a .gguf file or a tokenizer directory")
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))


def load_tokenizer(path: str | Path, *, use_corral: bool = True) -> BenchTokenizer:
    """Load ``path`` (a ``.gguf`` vocabulary or a tokenizer directory) for every engine.

    With corral importable, samples are encoded by ``TokenVocabulary.encode`` and the peers get
    ``vocab.hf_tokenizer`` when it has one; otherwise transformers loads the tokenizer (about
    15 s for a Llama 3 GGUF) and encodes with ``add_special_tokens=False``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer not found: {path}")
    notes: list[str] = []
    vocab = None
    if use_corral:
        try:
            from grammars import TokenVocabulary
        except ImportError as exc:
            notes.append(f"corral TokenVocabulary not importable ({exc}); using transformers")
        else:
            vocab = TokenVocabulary.from_pretrained(path)
    hf = getattr(vocab, "hf_tokenizer", None) if vocab is not None else None
    if hf is None:
        hf = _load_hf_tokenizer(path)
    if vocab is not None:
        return BenchTokenizer(path, hf, vocab, lambda text: _corral_continuation(vocab, text), "corral", notes)
    return BenchTokenizer(path, hf, None, lambda text: encode_continuation(hf, text), "transformers", notes)


def load_bench_tokenizer(path: str) -> BenchTokenizer:
    """``load_tokenizer`` with corral's vocabulary: the form the runners' worker processes load by name."""
    return load_tokenizer(path, use_corral=True)


def _corral_continuation(vocab: Any, text: str) -> list[int]:
    """``vocab.encode`` without a SentencePiece dummy prefix (checked on the exact token bytes)."""
    ids = list(vocab.encode(text))
    want = text.encode("utf-8")
    if vocab.decode(ids) == want:
        return ids
    probe = list(vocab.encode("\n"))
    both = list(vocab.encode("\n" + text))
    if both[: len(probe)] == probe and vocab.decode(both[len(probe):]) == want:
        return both[len(probe):]
    return ids


def encode_continuation(hf: Any, text: str) -> list[int]:
    """Token ids of ``text`` as generated after a prompt: no special tokens, no dummy prefix.

    SentencePiece tokenizers (Llama 2, Phi-3) prepend ``▁`` to the start of an input, which a
    continuation does not have; then the text is encoded after a ``"\n"`` probe and the probe's
    tokens are cut off (falling back to the plain encoding if they merged with the text).
    """
    ids = list(hf.encode(text, add_special_tokens=False))
    if not ids or text.startswith(" ") or not hf.convert_ids_to_tokens(ids[0]).startswith("\u2581"):
        return ids
    probe = list(hf.encode("\n", add_special_tokens=False))
    both = list(hf.encode("\n" + text, add_special_tokens=False))
    return both[len(probe):] if both[: len(probe)] == probe else ids


def _token_bytes(tokenizer: BenchTokenizer) -> tuple[bytes, ...]:
    """Exact bytes per token id: corral's vocabulary when loaded, else derived from ``hf``."""
    if tokenizer.vocab is not None:
        return tuple(tokenizer.vocab.token_bytes)
    from grammars import TokenVocabulary

    return tuple(TokenVocabulary.from_tokenizer(tokenizer.hf).token_bytes)


# --- adapters ----------------------------------------------------------------------------------


class Engine(Protocol):
    """What the benchmark loops need from an engine; see the module docstring."""

    name: str
    version: str
    options: dict
    eos_token_ids: tuple[int, ...]

    def reset_caches(self) -> None: ...

    def compile(self, kind: SourceKind, source: Any) -> Any: ...

    def matcher(self, compiled: Any) -> Any: ...

    def fill_mask(self, handle: Any) -> np.ndarray: ...

    def allowed(self, mask: np.ndarray, token: int) -> bool: ...

    def advance(self, handle: Any, token: int) -> bool: ...

    def is_accepting(self, handle: Any) -> bool: ...


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "dev" if dist == "corral" else "unknown"


def _message(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an engine's error, without xgrammar's ``[time] file.cc:820:`` prefix."""
    text = str(exc).strip() or type(exc).__name__
    first = next((line for line in text.splitlines() if line.strip()), text)
    first = re.sub(r"^\[[0-9:.\- ]+\] \S+\.cc:\d+: ", "", first)
    return first[:limit]


def _refused(exc: BaseException) -> EngineRefused:
    return EngineRefused(_message(exc), kind=type(exc).__name__)


class _PackedMaskAdapter:
    """What every adapter does alike, so that no engine's bit check or cache policy differs by accident.

    Masks are packed int32 rows, read with ``bit_is_set``; an engine without a cross-grammar
    cache has nothing to reset.
    """

    def allowed(self, mask: np.ndarray, token: int) -> bool:
        return bit_is_set(mask, token)

    def reset_caches(self) -> None:
        pass


class CorralEngine(_PackedMaskAdapter):
    """corral's ``compile_gbnf``/``compile_regex``/``Compiler.compile_json_schema`` and ``Matcher``."""

    name = "corral"

    def __init__(self, tokenizer: BenchTokenizer, *, whitespace: str = "flexible"):
        try:
            import grammars
        except ImportError as exc:
            raise EngineUnavailable(f"corral's grammars API is not importable ({exc})") from exc
        if tokenizer.vocab is None:
            raise EngineUnavailable("corral could not load the vocabulary (TokenVocabulary)")
        self._grammars = grammars
        self._vocab = tokenizer.vocab
        self._compiler = self._new_compiler()  # builds the vocabulary index once (~1 s)
        self._mask = grammars.allocate_token_bitmask(1, self._vocab.logits_width)
        self.schema_options: dict[str, Any] = {"whitespace": whitespace}
        self.eos_token_ids = tuple(sorted(int(t) for t in self._vocab.eos_token_ids))
        self.version = _version("corral")
        self.options = {
            "call": "compile_gbnf / compile_regex; Compiler(vocab, allow_empty_language=True)"
                    f".compile_json_schema(schema, whitespace={whitespace!r})",
            "whitespace": whitespace,
            "cache": "fresh Compiler per schema (no compiled grammar or token walk carried across files; "
                     "byte automata, which are pure functions of their expressions, are memoised per "
                     "process: grammars.memo)",
        }

    def reset_caches(self) -> None:
        self._compiler = self._new_compiler()

    def _new_compiler(self) -> Any:
        # a schema that accepts nothing compiles to a matcher that rejects every instance
        return self._grammars.Compiler(self._vocab, allow_empty_language=True)

    def compile(self, kind: SourceKind, source: Any) -> Any:
        g = self._grammars
        try:
            if kind == "json_schema":
                return self._compiler.compile_json_schema(source, **self.schema_options)
            if kind == "gbnf":
                return self._compiler.compile_gbnf(source)
            if kind == "regex":
                return self._compiler.compile_regex(source)
        except g.UnsupportedSchemaError as exc:
            raise EngineRefused(_message(exc), kind=type(exc).__name__, keyword=exc.keyword,
                                pointer=exc.pointer) from exc
        except (g.GrammarError, g.LimitExceeded) as exc:
            raise _refused(exc) from exc
        raise EngineRefused(f"corral adapter: unknown source kind {kind!r}", kind="ValueError")

    def matcher(self, compiled: Any) -> Any:
        return compiled.matcher()

    def fill_mask(self, handle: Any) -> np.ndarray:
        handle.fill_mask(self._mask, 0)
        return self._mask

    def advance(self, handle: Any, token: int) -> bool:
        try:
            handle.advance(token)
        except self._grammars.TokenRejected:
            return False
        return True

    def is_accepting(self, handle: Any) -> bool:
        return bool(handle.is_accepting())


class LLGuidanceEngine(_PackedMaskAdapter):
    """llguidance's ``LLMatcher`` over ``grammar_from`` (GBNF, regex) or ``grammar_from_json_schema``."""

    name = "llguidance"

    def __init__(self, tokenizer: BenchTokenizer):
        try:
            import llguidance
            import llguidance.hf
            import llguidance.numpy
        except ImportError as exc:
            raise EngineUnavailable(f"llguidance is not installed ({exc}); {BENCH_INSTALL}") from exc
        self._llg = llguidance
        self._fill = llguidance.numpy.fill_next_token_bitmask
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer.hf)
        self._mask = llguidance.numpy.allocate_token_bitmask(1, self._tokenizer.vocab_size)
        eos = tokenizer.hf.eos_token_id
        self.eos_token_ids = (int(eos),) if eos is not None else ()
        self.version = llguidance.__version__
        self.options = {
            "call": "LLMatcher(llguidance.hf.from_tokenizer(hf), grammar_from(kind, text) | "
                    "LLMatcher.grammar_from_json_schema(schema))",
            "json_options": "defaults (whitespace_flexible, not lenient, no coerce_one_of)",
            "cache": "none across grammars",
        }

    def compile(self, kind: SourceKind, source: Any) -> Any:
        try:
            if kind == "json_schema":
                grammar = self._llg.LLMatcher.grammar_from_json_schema(json.dumps(source))
            else:
                grammar = self._llg.grammar_from(kind, source)
        except ValueError as exc:
            raise _refused(exc) from exc
        # The constructor compiles and never raises for grammar errors: it enters an error state.
        # The pristine matcher is the compiled form; matcher() copies it.
        pristine = self._llg.LLMatcher(self._tokenizer, grammar, log_level=0)
        if pristine.is_error():
            raise EngineRefused(_message(Exception(pristine.get_error())), kind="LLMatcher error")
        return pristine

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill_mask(self, handle: Any) -> np.ndarray:
        self._fill(handle, self._mask, 0)
        return self._mask

    def advance(self, handle: Any, token: int) -> bool:
        return bool(handle.consume_token(token))

    def is_accepting(self, handle: Any) -> bool:
        return bool(handle.is_accepting())


class XGrammarEngine(_PackedMaskAdapter):
    """xgrammar's ``GrammarCompiler`` (one thread, no cache; schemas in compliant mode) and ``GrammarMatcher``."""

    name = "xgrammar"

    def __init__(self, tokenizer: BenchTokenizer):
        try:
            import xgrammar
        except ImportError as exc:
            raise EngineUnavailable(f"xgrammar is not installed ({exc}); {BENCH_INSTALL}") from exc
        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer.hf)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._mask_tensor = xgrammar.allocate_token_bitmask(1, info.vocab_size)
        self._mask = self._mask_tensor.numpy()  # shares memory with the tensor
        self.eos_token_ids = tuple(int(t) for t in info.stop_token_ids)
        self.version = _version("xgrammar")
        self.options = {
            "call": "GrammarCompiler(info, max_threads=1, cache_enabled=False): compile_grammar / compile_regex / "
                    "compile_json_schema(schema, any_whitespace=True, strict_mode=False)",
            "any_whitespace": True,
            "strict_mode": False,
            "cache": "disabled (cache_enabled=False)",
        }

    def compile(self, kind: SourceKind, source: Any) -> Any:
        try:
            if kind == "json_schema":
                return self._compiler.compile_json_schema(json.dumps(source), any_whitespace=True, strict_mode=False)
            if kind == "gbnf":
                return self._compiler.compile_grammar(source)
            return self._compiler.compile_regex(source)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses from C++
            raise _refused(exc) from exc

    def matcher(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled)

    def fill_mask(self, handle: Any) -> np.ndarray:
        handle.fill_next_token_bitmask(self._mask_tensor, 0)
        return self._mask

    def advance(self, handle: Any, token: int) -> bool:
        return bool(handle.accept_token(token))

    def is_accepting(self, handle: Any) -> bool:
        return bool(handle.is_completed())


class OutlinesEngine(_PackedMaskAdapter):
    """outlines-core: regex (or schema → regex) → ``Index`` (token DFA) → ``Guide``; no grammars."""

    name = "outlines"

    def __init__(self, tokenizer: BenchTokenizer):
        try:
            import outlines_core
            from outlines_core.json_schema import build_regex_from_schema
            from outlines_core.kernels.numpy import allocate_token_bitmask, fill_next_token_bitmask
        except ImportError as exc:
            raise EngineUnavailable(f"outlines-core is not installed ({exc}); {BENCH_INSTALL}") from exc
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
            "call": "Guide(Index(regex | build_regex_from_schema(json.dumps(schema)), Vocabulary(eos, token_bytes)))",
            "whitespace_pattern": "default ([ ]?)",
            "max_recursion_depth": "default (3)",
            "cache": "none across grammars",
        }

    def compile(self, kind: SourceKind, source: Any) -> Any:
        if kind == "gbnf":
            raise EngineRefused("outlines-core takes regular expressions and JSON Schemas, not grammars",
                                kind="unsupported")
        try:
            regex = self._regex(json.dumps(source)) if kind == "json_schema" else source
            return self._oc.Index(regex, self._vocabulary)
        except Exception as exc:  # PyO3 surfaces Rust errors as ValueError/TypeError/...
            raise _refused(exc) from exc

    def matcher(self, compiled: Any) -> Any:
        return self._oc.Guide(compiled)

    def fill_mask(self, handle: Any) -> np.ndarray:
        self._fill(handle, self._mask)
        return self._mask

    def advance(self, handle: Any, token: int) -> bool:
        try:
            handle.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True

    def is_accepting(self, handle: Any) -> bool:
        return bool(handle.is_finished())


ENGINES: dict[str, Callable[[BenchTokenizer], Engine]] = {
    "corral": CorralEngine,
    "llguidance": LLGuidanceEngine,
    "xgrammar": XGrammarEngine,
    "outlines": OutlinesEngine,
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


def load_engine(spec: str, tokenizer: Any) -> Engine:
    """The engine named ``spec`` (a key of ``ENGINES`` or a ``module:factory``)."""
    if spec in ENGINES:
        return ENGINES[spec](tokenizer)
    if ":" in spec:
        return resolve(spec)(tokenizer)
    raise ValueError(f"unknown engine {spec!r}; choose from {', '.join(ENGINES)} or give module:factory")


def warm_up(engine: Engine, kind: SourceKind = "json_schema", source: Any = None) -> None:
    """Compile and mask a trivial grammar once, so one-time set-up is not charged to the first workload."""
    if source is None:
        source = {"type": "integer"} if kind == "json_schema" else "a"
    try:
        handle = engine.matcher(engine.compile(kind, source))
    except EngineRefused:
        return
    engine.fill_mask(handle)
    engine.reset_caches()


def compile_schema(engine: Engine, schema: Any, corral_options: dict | None = None) -> Any:
    """``engine.compile("json_schema", schema)``, with ``corral_options`` (``JsonSchemaOptions``
    fields) added to corral's ``schema_options`` for this one call; the peers take no options."""
    if not corral_options or getattr(engine, "name", "") != "corral":
        return engine.compile("json_schema", schema)
    plain = engine.schema_options
    engine.schema_options = {**plain, **corral_options}
    try:
        return engine.compile("json_schema", schema)
    finally:
        engine.schema_options = plain
