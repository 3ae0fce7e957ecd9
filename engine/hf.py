"""A transformers ``LogitsProcessor`` that applies corral masks inside ``model.generate``.

**This is a compatibility shim.** A logits processor is a per-step callback that must rebuild
the matcher state from ``input_ids`` it did not produce — the pattern STYLE.md lists as an
anti-pattern for our own code. The primary path is the engine's loop (``engine.generate``),
which owns matching, fast-forwarding, budget-aware closing and stop strings. Use this class
when you must stay inside ``model.generate`` (its beam search, streamers, other processors)::

    processor = CorralLogitsProcessor(compiled_grammar)          # or a list, one per row
    out = model.generate(**batch, logits_processor=[processor], max_new_tokens=64)
    processor.reset()                                            # before reusing it

What it handles:

* batches, one matcher per row created lazily on the first call; a list of grammars gives
  each row its own (mixed batches);
* left padding: it remembers the prompt width of the first call and reads only the columns
  after it, so padding never reaches a matcher;
* padded vocabularies: logits wider than the tokenizer are masked beyond it;
* several EOS ids: any EOS of the grammar's vocabulary is allowed exactly when the row's
  grammar accepts. Build the vocabulary with every id ``generation_config.eos_token_id``
  names (``TokenVocabulary.from_pretrained`` on a model folder does), or ``generate`` may
  continue a row past an EOS the grammar does not know about;
* finished rows (``generate`` pads them after EOS) are left unmasked so the softmax stays finite;
* reordered rows (beam search): each call re-synchronises every row's matcher with its tokens
  (longest common prefix, ``rollback``, ``advance``), so beams that swap rows stay correct at
  the cost of replaying tokens;
* reuse: ``reset()`` forgets everything; a call whose ``input_ids`` are not longer than the
  remembered prompt also starts over.

Errors: ``TokenRejected`` if ``generate`` picked a token the mask forbade (another processor
or a warper un-masked it). Not thread-safe; ``supports_continuous_batching = False``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessor

from grammars import CompiledGrammar, allocate_token_bitmask
from samplers import apply_token_bitmask_inplace

__all__ = ["CorralLogitsProcessor"]


class CorralLogitsProcessor(LogitsProcessor):
    """Masks ``model.generate`` scores with compiled grammars; see the module docstring."""

    supports_continuous_batching = False

    def __init__(self, grammar: CompiledGrammar | Sequence[CompiledGrammar]):
        grammars = [grammar] if isinstance(grammar, CompiledGrammar) else list(grammar)
        if not grammars or not all(isinstance(g, CompiledGrammar) for g in grammars):
            raise TypeError("CorralLogitsProcessor needs a CompiledGrammar or a non-empty list of them")
        widths = {g.vocab.logits_width for g in grammars}
        if len(widths) != 1:
            raise ValueError(f"all grammars must be compiled for one vocabulary; got logits widths {sorted(widths)}")
        self._grammars = grammars
        self._eos = grammars[0].vocab.eos_token_ids
        self._width = widths.pop()
        self.reset()

    def reset(self) -> None:
        """Forget all rows; the next call starts a new ``generate``."""
        self._prompt_width: int | None = None
        self._matchers: list = []
        self._consumed: list[list[int]] = []
        self._bitmask = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, seq_len = input_ids.shape
        if self._prompt_width is None or seq_len <= self._prompt_width or batch != len(self._matchers):
            self._start(batch, seq_len)
        generated = input_ids[:, self._prompt_width :].tolist()
        for row, tokens in enumerate(generated):
            self._sync(row, tokens)
        bitmask = self._bitmask
        for row, matcher in enumerate(self._matchers):
            if matcher.is_terminated():
                bitmask[row] = -1  # finished: generate pads this row; keep its scores finite
            else:
                matcher.fill_mask(bitmask, row)
        apply_token_bitmask_inplace(scores, bitmask)
        return scores

    # --- internals -------------------------------------------------------------------------

    def _start(self, batch: int, seq_len: int) -> None:
        if len(self._grammars) not in (1, batch):
            raise ValueError(f"{len(self._grammars)} grammars for a batch of {batch} rows; pass one or one per row")
        grammars = self._grammars * batch if len(self._grammars) == 1 else self._grammars
        self._prompt_width = seq_len
        self._matchers = [g.matcher() for g in grammars]
        self._consumed = [[] for _ in range(batch)]
        self._bitmask = allocate_token_bitmask(batch, self._width)

    def _sync(self, row: int, tokens: list[int]) -> None:
        """Bring row ``row``'s matcher to ``tokens`` (ignoring everything after an EOS)."""
        for i, token in enumerate(tokens):
            if token in self._eos:
                tokens = tokens[: i + 1]
                break
        consumed = self._consumed[row]
        common = 0
        limit = min(len(consumed), len(tokens))
        while common < limit and consumed[common] == tokens[common]:
            common += 1
        matcher = self._matchers[row]
        if common < len(consumed):
            matcher.rollback(len(consumed) - common)
            del consumed[common:]
        for token in tokens[common:]:
            matcher.advance(token)  # TokenRejected if generate picked a masked-out token
            consumed.append(token)
