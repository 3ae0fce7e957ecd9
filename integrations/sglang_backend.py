"""corral as an SGLang grammar backend: ``python -m sglang.launch_server ... --grammar-backend corral``.

SGLang (0.5.x) loads the ``sglang.srt.plugins`` entry points before it parses its command line;
corral's entry point is ``register``, which adds ``"corral"`` to the ``--grammar-backend`` choices
and to SGLang's grammar-backend registry. The scheduler then builds one ``CorralGrammarBackend``
from its tokenizer and the model's vocabulary size:

- one ``TokenVocabulary`` from that tokenizer (``TokenVocabulary.from_tokenizer``; EOS ids are the
  tokenizer's plus the model's ``hf_eos_token_id``; logits width is the model's ``vocab_size``,
  whose padding columns are never allowed) and one ``Compiler`` for every request, so trie walks
  and compiled grammars are shared the way SGLang shares XGrammar's ``GrammarCompiler``;
- ``json_schema`` compiles with ``compile_json_schema`` (flexible whitespace unless
  ``--constrained-json-disable-any-whitespace``, bounded by ``--constrained-json-max-whitespace-cnt``),
  ``regex`` with ``compile_regex``, ``ebnf`` with ``compile_gbnf`` (SGLang's EBNF is XGrammar's
  GBNF dialect, start rule ``root``); ``structural_tag`` is refused with a message;
- a constraint corral cannot compile becomes SGLang's ``InvalidGrammarObject`` carrying corral's
  error message, which SGLang returns to the client as the request's abort reason.

Each request gets a ``CorralGrammar`` over a ``grammars.Matcher``. Its masks are corral's packed
int32 bitmasks, ``(batch, ceil(vocab / 32))`` words, the layout SGLang's XGrammar backend uses, so
SGLang's batching code moves them unchanged; they are applied with
``samplers.apply_token_bitmask_inplace`` on any device.

SGLang is not a dependency of corral: this module imports it at import time and is only imported
by SGLang's plugin loader (or by code that already runs SGLang).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

try:
    import torch
    from sglang.srt.constrained.base_grammar_backend import (
        BaseGrammarBackend,
        BaseGrammarObject,
        GrammarStats,
        InvalidGrammarObject,
        register_grammar_backend,
    )
except ImportError as exc:  # pragma: no cover - exercised in a venv without SGLang
    raise ImportError(
        "integrations.sglang_backend is corral's SGLang grammar backend and needs SGLang 0.5.x "
        f"installed in this environment (pip install -r scripts/integration/sglang.txt): {exc}"
    ) from exc

from grammars import (
    CompiledGrammar,
    Compiler,
    ConstraintError,
    Matcher,
    TokenVocabulary,
)
from grammars.bitmask import mask_words
from samplers import apply_token_bitmask_inplace

__all__ = ["BACKEND_NAME", "CorralGrammar", "CorralGrammarBackend", "create_backend", "register"]

_log = logging.getLogger(__name__)

#: The value of ``--grammar-backend`` that selects corral.
BACKEND_NAME = "corral"

#: What a failed compile may raise besides corral's own errors: a schema of the wrong type
#: (``TypeError``), bad option values (``ValueError``) and grammars nested past Python's stack.
_COMPILE_ERRORS = (ConstraintError, TypeError, ValueError, RecursionError)

#: XGrammar's key for "any JSON value" (``response_format={"type": "json_object"}``).
_ANY_JSON = "$$ANY$$"


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: make ``--grammar-backend corral`` valid and known.

    Idempotent (SGLang calls plugins once per process, tests may call it again).
    """
    from sglang.srt.server_args import (
        GRAMMAR_BACKEND_CHOICES,
        add_grammar_backend_choices,
    )

    if BACKEND_NAME not in GRAMMAR_BACKEND_CHOICES:
        add_grammar_backend_choices([BACKEND_NAME])
    register_grammar_backend(BACKEND_NAME, create_backend)


def create_backend(server_args, tokenizer, vocab_size: int, eos_token_ids: Iterable[int] | None = None) -> CorralGrammarBackend:
    """The registry's init function: SGLang calls it with these four arguments
    (``create_grammar_backend``), reading the JSON whitespace flags from ``server_args``."""
    disable_any_whitespace = bool(getattr(server_args, "constrained_json_disable_any_whitespace", False))
    max_whitespace = getattr(server_args, "constrained_json_max_whitespace_cnt", None)
    if getattr(server_args, "constrained_json_whitespace_pattern", None):
        _log.warning("corral grammar backend: --constrained-json-whitespace-pattern is not supported and is "
                     "ignored; JSON whitespace is [ \\t\\n\\r] (or none with --constrained-json-disable-any-whitespace)")
    return CorralGrammarBackend(tokenizer, vocab_size, eos_token_ids,
                                any_whitespace=not disable_any_whitespace, max_whitespace=max_whitespace)


def vocabulary_for(tokenizer, vocab_size: int, eos_token_ids: Iterable[int] | None = None) -> TokenVocabulary:
    """corral's vocabulary of SGLang's tokenizer, as wide as the model's logits.

    EOS ids: the tokenizer's ``eos_token_id`` plus the model's (SGLang passes
    ``hf_eos_token_id``, which includes ``generation_config.json``'s). The logits width is the
    larger of the model's ``vocab_size`` and the tokenizer's size, so padding columns exist and
    are never allowed. A tokenizer whose tokens have no exact bytes raises ``VocabularyError``.
    """
    eos = set(eos_token_ids or ())
    own = getattr(tokenizer, "eos_token_id", None)
    if isinstance(own, int):
        eos.add(own)
    vocab = TokenVocabulary.from_tokenizer(tokenizer, eos_token_ids=eos or None)
    if vocab_size > vocab.logits_width:
        vocab = dataclasses.replace(vocab, logits_width=int(vocab_size))
    return vocab


class CorralGrammar(BaseGrammarObject):
    """One request's constraint: a ``grammars.Matcher`` behind SGLang's grammar-object interface.

    SGLang may feed tokens after EOS (speculative verification accepts, then rolls back); those
    are ignored as XGrammar's backend ignores them, and counted so that ``rollback`` undoes
    exactly what the caller fed.
    """

    def __init__(self, compiled: CompiledGrammar, matcher: Matcher, key_string: str,
                 grammar_stats: GrammarStats | None = None, *, ignored: int = 0):
        super().__init__()
        self.compiled = compiled
        self.matcher = matcher
        self.key_string = key_string
        self.grammar_stats = grammar_stats
        self._ignored = ignored  # tokens fed after EOS, not given to the matcher

    @property
    def vocab(self) -> TokenVocabulary:
        return self.compiled.vocab

    # --- the sequence ---------------------------------------------------------------------------

    def accept_token(self, token: int) -> None:
        """Consume ``token``; ``ValueError`` (corral's ``TokenRejected``) when the grammar forbids
        it, which SGLang turns into an aborted request."""
        self.current_token = token
        if self.matcher.is_terminated():
            self._ignored += 1
            return
        self.matcher.advance(int(token))

    def rollback(self, k: int) -> None:
        """Undo the last ``k`` accepted tokens (those ignored after EOS first)."""
        skipped = min(k, self._ignored)
        self._ignored -= skipped
        self.matcher.rollback(k - skipped)

    def is_terminated(self) -> bool:
        """EOS was accepted: SGLang stops masking this row."""
        return self.matcher.is_terminated()

    def copy(self) -> CorralGrammar:
        """An independent grammar at the same position (SGLang copies its cached, unstarted
        template for every request); the compiled grammar is shared."""
        stats = self.grammar_stats
        if stats is not None:
            stats = dataclasses.replace(stats, is_cache_hit=True, tree_traversal_time=[])
        return CorralGrammar(self.compiled, self.matcher.fork(), self.key_string, stats, ignored=self._ignored)

    # --- masks ----------------------------------------------------------------------------------

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device) -> torch.Tensor:
        """``int32[batch_size, words]``, every bit set: rows SGLang does not fill (finished or
        unconstrained requests) stay unconstrained. Pinned when CUDA is there, for the
        non-blocking copy in ``move_vocab_mask``."""
        words = mask_words(max(int(vocab_size), self.vocab.logits_width))
        return torch.full((batch_size, words), -1, dtype=torch.int32, pin_memory=torch.cuda.is_available())

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        """Write row ``idx``: bit ``i`` set iff token ``i`` may come next. Does not change the state."""
        if vocab_mask.device.type == "cpu":
            self.matcher.fill_mask(vocab_mask.numpy(), idx)
            return
        row = vocab_mask[idx].cpu()
        self.matcher.fill_mask(row.numpy(), 0)
        vocab_mask[idx].copy_(row)

    @staticmethod
    def reset_vocab_mask(vocab_mask: torch.Tensor) -> None:
        """Back to unconstrained (every bit set)."""
        vocab_mask.fill_(-1)

    @staticmethod
    def move_vocab_mask(vocab_mask: torch.Tensor, device) -> torch.Tensor:
        return vocab_mask.to(device, non_blocking=True)

    @staticmethod
    def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
        """``-inf`` for every disallowed token, in place (``samplers.apply_token_bitmask_inplace``)."""
        apply_token_bitmask_inplace(logits, vocab_mask)

    # --- jump forward (kept for callers of the older scheduler interface) ------------------------

    def try_jump_forward(self, tokenizer) -> tuple[list[int], str] | None:
        """The tokens the grammar forces from here (each the only one allowed) and their text,
        or None when the next token is a choice. Consumes nothing."""
        forced = self.matcher.forced_tokens()
        if not forced:
            return None
        return forced, self.vocab.decode(forced).decode("utf-8", errors="replace")

    def jump_forward_str_state(self, helper: tuple[list[int], str]) -> tuple[str, int]:
        _, text = helper
        return text, -1

    def jump_and_retokenize(self, old_output_ids: list[int], new_output_ids: list[int], next_state: int) -> None:
        """Re-sync after SGLang re-tokenized the output with the jump text appended: roll back to
        the common prefix, then accept the new tokens."""
        common = 0
        for old, new in zip(old_output_ids, new_output_ids):
            if old != new:
                break
            common += 1
        self.rollback(len(old_output_ids) - common)
        for token in new_output_ids[common:]:
            self.accept_token(token)

    def __repr__(self) -> str:
        return f"CorralGrammar({self.key_string!r}, {self.matcher!r})"


class CorralGrammarBackend(BaseGrammarBackend):
    """Compiles SGLang's constraints with one corral ``Compiler`` bound to the model's vocabulary.

    SGLang calls ``dispatch_*`` from its compile thread pool; the Compiler is thread-safe and
    caches by constraint, beside SGLang's own cache of grammar objects.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Iterable[int] | None = None, *,
                 any_whitespace: bool = True, max_whitespace: int | None = None,
                 compiler: Compiler | None = None):
        super().__init__()
        self.vocab = compiler.vocab if compiler is not None else vocabulary_for(tokenizer, vocab_size, eos_token_ids)
        self.compiler = compiler if compiler is not None else Compiler(self.vocab)
        self.vocab_size = vocab_size
        self.json_options: dict = {"whitespace": "flexible" if any_whitespace else "compact"}
        if any_whitespace and max_whitespace is not None:
            self.json_options["max_whitespace"] = int(max_whitespace)

    def _dispatch(self, kind: str, key_string: str, compile_) -> BaseGrammarObject:
        try:
            compiled = compile_()
        except _COMPILE_ERRORS as exc:
            _log.error("corral: invalid %s constraint %r: %s", kind, key_string[:200], exc)
            return InvalidGrammarObject(f"{type(exc).__name__}: {exc}")
        return CorralGrammar(compiled, compiled.matcher(), key_string, GrammarStats(dispatch_type=kind))

    def dispatch_json(self, key_string: str) -> BaseGrammarObject:
        schema = {} if key_string == _ANY_JSON else key_string
        return self._dispatch("json", key_string, lambda: self.compiler.compile_json_schema(schema, **self.json_options))

    def dispatch_regex(self, key_string: str) -> BaseGrammarObject:
        return self._dispatch("regex", key_string, lambda: self.compiler.compile_regex(key_string))

    def dispatch_ebnf(self, key_string: str) -> BaseGrammarObject:
        return self._dispatch("ebnf", key_string, lambda: self.compiler.compile_gbnf(key_string))

    def dispatch_structural_tag(self, key_string: str) -> BaseGrammarObject:
        return InvalidGrammarObject(
            "the corral grammar backend does not support structural_tag constraints; "
            "use json_schema, regex or ebnf, or --grammar-backend xgrammar")
