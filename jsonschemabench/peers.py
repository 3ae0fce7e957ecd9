"""One small interface over corral and its peers (llguidance, xgrammar), for the benchmarks.

Every engine is wrapped in an adapter with the same five operations, so the timing loop in
``grammar_bench`` cannot favour one of them::

    compiled = engine.compile("gbnf", text)      # or ("regex", pattern); raises EngineRefused
    handle = engine.matcher(compiled)            # a fresh per-sequence matcher
    mask = engine.fill_mask(handle)              # packed int32 row, bit i = token i allowed
    engine.allowed(mask, token) -> bool          # read one bit (never timed)
    engine.advance(handle, token) -> bool        # False when the engine rejects the token

``fill_mask`` returns the adapter's own buffer, valid until the next call. ``compile`` raises
``EngineRefused`` when an engine will not take a grammar (its message goes into the table);
constructing an adapter raises ``EngineUnavailable`` when its package is not installed.

Adapters import their engine lazily, so this module imports without llguidance or xgrammar.
Single-threaded timing needs ``RAYON_NUM_THREADS=1`` in the environment before llguidance is
first used; ``grammar_bench.main`` sets it.

Engine notes, measured with llguidance 1.9.1 and xgrammar 0.2.8:

- llguidance takes GBNF through ``llguidance.grammar_from("gbnf", text)``: a Python converter
  (``llguidance.gbnf_to_lark``) rewrites it to its Lark dialect, which has a *greedy lexer*, so
  some strings of a character-level GBNF grammar are rejected (see ``samples.py``).
  ``LLMatcher(...)`` never raises for grammar errors: it enters an error state (``is_error()``).
- xgrammar reads GBNF directly (``GrammarCompiler.compile_grammar(text)``, root rule ``root``)
  and runs a byte-level Earley parser, so it follows GBNF's character-level semantics.
  Its compiler caches by grammar text; the adapter disables the cache so repeats measure
  compilation, and compiles with one thread.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

import numpy as np

__all__ = [
    "GrammarKind",
    "EngineRefused",
    "EngineUnavailable",
    "BenchTokenizer",
    "Engine",
    "CorralEngine",
    "LLGuidanceEngine",
    "XGrammarEngine",
    "ENGINES",
    "load_tokenizer",
    "encode_continuation",
    "bit_is_set",
]

GrammarKind = Literal["gbnf", "regex"]


class EngineRefused(Exception):
    """The engine would not compile this grammar (its own error message is kept)."""


class EngineUnavailable(Exception):
    """The engine's package (or the API it needs) is not importable in this environment."""


def bit_is_set(mask: np.ndarray, token: int) -> bool:
    """Whether bit ``token`` is set in a packed int32 mask row (bit ``t % 32`` of word ``t // 32``)."""
    word = token >> 5
    if word >= mask.shape[-1]:
        return False
    return bool((int(mask.reshape(-1)[word]) >> (token & 31)) & 1)


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


class Engine(Protocol):
    """What the benchmark loop needs from an engine; see the module docstring."""

    name: str
    version: str
    eos_token_ids: tuple[int, ...]

    def compile(self, kind: GrammarKind, text: str) -> Any: ...

    def matcher(self, compiled: Any) -> Any: ...

    def fill_mask(self, handle: Any) -> np.ndarray: ...

    def allowed(self, mask: np.ndarray, token: int) -> bool: ...

    def advance(self, handle: Any, token: int) -> bool: ...


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "dev" if dist == "corral" else "unknown"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    text = re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", text.splitlines()[0])  # xgrammar's "[time] file.cc:820: "
    return text[:200]


class CorralEngine:
    """corral's own ``compile_gbnf``/``compile_regex`` and ``Matcher``, behind the common shape."""

    name = "corral"

    def __init__(self, tokenizer: BenchTokenizer):
        try:
            from grammars import (
                TokenRejected,
                allocate_token_bitmask,
                compile_gbnf,
                compile_regex,
            )
        except ImportError as exc:
            raise EngineUnavailable(f"corral's grammars API is not importable yet ({exc})") from exc
        if tokenizer.vocab is None:
            raise EngineUnavailable("corral could not load the vocabulary (TokenVocabulary)")
        self._vocab = tokenizer.vocab
        self._compilers = {"gbnf": compile_gbnf, "regex": compile_regex}
        self._rejected = TokenRejected
        self._mask = allocate_token_bitmask(1, self._vocab.logits_width)
        self.eos_token_ids = tuple(int(t) for t in self._vocab.eos_token_ids)
        self.version = _dist_version("corral")

    def compile(self, kind: GrammarKind, text: str) -> Any:
        from grammars import GrammarError, LimitExceeded

        try:
            return self._compilers[kind](text, self._vocab)
        except (GrammarError, LimitExceeded) as exc:
            raise EngineRefused(f"{type(exc).__name__}: {_first_line(exc)}") from exc

    def matcher(self, compiled: Any) -> Any:
        return compiled.matcher()

    def fill_mask(self, handle: Any) -> np.ndarray:
        handle.fill_mask(self._mask, 0)
        return self._mask

    def allowed(self, mask: np.ndarray, token: int) -> bool:
        return bit_is_set(mask, token)

    def advance(self, handle: Any, token: int) -> bool:
        try:
            handle.advance(token)
        except self._rejected:
            return False
        return True


class LLGuidanceEngine:
    """llguidance's ``LLMatcher``: GBNF via ``grammar_from("gbnf")`` (converted to its Lark)."""

    name = "llguidance"

    def __init__(self, tokenizer: BenchTokenizer):
        try:
            import llguidance
            import llguidance.hf
            import llguidance.numpy
        except ImportError as exc:
            raise EngineUnavailable(f"llguidance is not installed ({exc}); pip install -e '.[bench]'") from exc
        self._llg = llguidance
        self._fill = llguidance.numpy.fill_next_token_bitmask
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer.hf)
        self._mask = llguidance.numpy.allocate_token_bitmask(1, self._tokenizer.vocab_size)
        eos = tokenizer.hf.eos_token_id
        self.eos_token_ids = (int(eos),) if eos is not None else ()
        self.version = llguidance.__version__

    def compile(self, kind: GrammarKind, text: str) -> Any:
        try:
            grammar = self._llg.grammar_from(kind, text)
        except ValueError as exc:
            raise EngineRefused(_first_line(exc)) from exc
        # LLMatcher compiles in its constructor and never raises for grammar errors: it enters an
        # error state instead. The pristine matcher is the compiled form; matcher() copies it.
        pristine = self._llg.LLMatcher(self._tokenizer, grammar, log_level=0)
        if pristine.is_error():
            raise EngineRefused(_first_line(Exception(pristine.get_error())))
        return pristine

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill_mask(self, handle: Any) -> np.ndarray:
        self._fill(handle, self._mask, 0)
        return self._mask

    def allowed(self, mask: np.ndarray, token: int) -> bool:
        return bit_is_set(mask, token)

    def advance(self, handle: Any, token: int) -> bool:
        return bool(handle.consume_token(token))


class XGrammarEngine:
    """xgrammar's ``GrammarCompiler`` (one thread, no cache) and ``GrammarMatcher``."""

    name = "xgrammar"

    def __init__(self, tokenizer: BenchTokenizer):
        try:
            import xgrammar
        except ImportError as exc:
            raise EngineUnavailable(f"xgrammar is not installed ({exc}); pip install -e '.[bench]'") from exc
        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer.hf)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._mask_tensor = xgrammar.allocate_token_bitmask(1, info.vocab_size)
        self._mask = self._mask_tensor.numpy()  # shares memory with the tensor
        self.eos_token_ids = tuple(int(t) for t in info.stop_token_ids)
        self.version = _dist_version("xgrammar")

    def compile(self, kind: GrammarKind, text: str) -> Any:
        try:
            if kind == "gbnf":
                return self._compiler.compile_grammar(text)
            return self._compiler.compile_regex(text)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses from C++
            raise EngineRefused(f"{type(exc).__name__}: {_first_line(exc)}") from exc

    def matcher(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled)

    def fill_mask(self, handle: Any) -> np.ndarray:
        handle.fill_next_token_bitmask(self._mask_tensor, 0)
        return self._mask

    def allowed(self, mask: np.ndarray, token: int) -> bool:
        return bit_is_set(mask, token)

    def advance(self, handle: Any, token: int) -> bool:
        return bool(handle.accept_token(token))


ENGINES: dict[str, Callable[[BenchTokenizer], Engine]] = {
    "corral": CorralEngine,
    "llguidance": LLGuidanceEngine,
    "xgrammar": XGrammarEngine,
}

