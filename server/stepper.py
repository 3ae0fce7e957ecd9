"""One decoding step over rows that come and go: the step-level form of ``engine.decoding``.

``engine.decode`` runs a fixed set of rows to the end; a server needs rows to join and leave
between steps (continuous batching), each with its own budget, stop strings and sampler. This
module is that loop cut at the step, built on the same primitives and following
``engine.decoding._Loop`` rule for rule (its module docstring states them): per row
``Matcher.fill_mask`` into one packed bitmask, a row whose mask holds only EOS ends without a
model call, one ``LanguageModel.next_logits`` for every running row, the mask applied in place
(``samplers.apply_token_bitmask_inplace``) for mask-based samplers, the draw (the masked
sampler's draw done directly, as ``_Loop`` does; other samplers through ``SamplingRun.draw``),
budget-aware closing through ``engine.closing.BudgetClosing`` (a ``NarrowedMatcher`` the sampler
draws from), forced tokens appended without sampling, stop strings cut. A test pins the
equivalence: with a ``ScriptedLM`` a row decoded here draws exactly what ``engine.generate``
draws for the same seed.

Differences, all about serving: an error in one row (a ``LimitExceeded`` from a pathological
grammar, a sampler failure) finishes that row with ``error`` set and leaves the others running;
``step`` also scores *extra* prefixes in the same forward pass (sequence-level samplers such as
SMC, which run their own loop in another thread, borrow the batch this way).

Not thread-safe: one ``Stepper`` belongs to the thread that owns the model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.closing import BudgetClosing, ClosingPlanner
from engine.lm import LanguageModel
from grammars import TokenVocabulary, UnconstrainedMatcher, allocate_token_bitmask
from grammars.bitmask import pack_bool
from samplers import (
    Draw,
    NoAllowedToken,
    SamplingParams,
    SamplingRun,
    apply_token_bitmask_inplace,
    sample_categorical,
)
from samplers.base import process_logits
from samplers.kernels import disallow_tokens_inplace
from samplers.masked import masked_draw
from samplers.narrowing import NarrowedMatcher

__all__ = ["RowOptions", "Row", "Stepper"]

log = logging.getLogger("server.stepper")


@dataclass(frozen=True)
class RowOptions:
    """One row's loop settings (``engine.DecodeOptions``, per row)."""

    max_tokens: int
    stop: tuple[str, ...] = ()
    fast_forward: bool = True
    premask: bool = True
    budget_closing: bool = True
    max_rejections: int = 16
    ignore_eos: bool = False
    #: the masked sampler's parameters: the row draws from the premasked logits itself
    direct_params: SamplingParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {self.max_tokens!r}")
        if self.direct_params is not None and not self.premask:
            raise ValueError("direct_params needs premask=True")


@dataclass
class Row:
    """One sequence being decoded. ``finish`` is set when it ends (``"stop"``, ``"length"``,
    ``"stop_string"``, or ``"error"`` with ``error`` holding the exception)."""

    prompt: list[int]
    matcher: Any
    run: SamplingRun
    generator: torch.Generator | None
    options: RowOptions
    closing: BudgetClosing | None = None
    tokens: list[int] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    finish: str | None = None
    error: BaseException | None = None
    forced: int = 0
    steered: int = 0
    eos_drawn: bool = False
    log_weight: float = 0.0

    @property
    def constrained(self) -> bool:
        return not isinstance(self.matcher, UnconstrainedMatcher)

    @property
    def finished(self) -> bool:
        return self.finish is not None

    @property
    def completion_tokens(self) -> int:
        """Tokens generated, EOS included when one was drawn (what ``max_tokens`` counts)."""
        return len(self.tokens) + int(self.eos_drawn)

    def stable_length(self) -> int:
        """Bytes of ``text`` that no later token can remove: all of it once finished, else all
        but what could still be the start of a stop string."""
        if self.finish is not None or not self.options.stop:
            return len(self.text)
        hold = max(len(s.encode("utf-8")) for s in self.options.stop) - 1
        return max(0, len(self.text) - hold)


class Stepper:
    """Steps rows of any mix of constraints, samplers and budgets through one shared model."""

    def __init__(self, lm: LanguageModel, vocab: TokenVocabulary, planner: ClosingPlanner | None = None):
        if vocab.logits_width != lm.logits_width:
            raise ValueError(f"vocabulary logits_width {vocab.logits_width} != model logits_width {lm.logits_width}")
        self.lm = lm
        self.vocab = vocab
        self.planner = planner if planner is not None else ClosingPlanner(vocab)
        self.eos = vocab.eos_token_ids
        eos_bool = np.zeros(vocab.logits_width, dtype=bool)
        eos_bool[list(self.eos)] = True
        self.text_words = ~pack_bool(eos_bool, vocab.logits_width)
        self.forward_calls = 0

    def closing_for(self, matcher: Any, options: RowOptions) -> BudgetClosing | None:
        """The row's budget-aware closing rule (None: off, or an unconstrained row)."""
        if not options.budget_closing or isinstance(matcher, UnconstrainedMatcher):
            return None
        return BudgetClosing(self.planner, matcher.num_consumed + options.max_tokens,
                             lazy_checks=options.max_rejections)

    def begin(self, row: Row) -> None:
        """Prepare a joining row: the tokens its grammar forces before the first draw."""
        try:
            self._fast_forward(row)
        except Exception as exc:  # noqa: BLE001 - one row's failure never stops the batch
            self.fail(row, exc)

    def fail(self, row: Row, exc: BaseException) -> None:
        row.error = exc
        self._finish(row, "error")

    def cancel(self, row: Row) -> None:
        """End a row nobody waits for (its client left); the sampler hears it did not complete."""
        if row.finish is None:
            row.finish = "cancelled"
            try:
                row.run.finish(list(row.tokens), completed=False)
            except Exception:  # noqa: BLE001 - a sampler's bookkeeping must not break the batch
                log.debug("a sampler's finish() failed", exc_info=True)

    def step(self, rows: Sequence[Row], extra: Sequence[Sequence[int]] = ()) -> torch.Tensor | None:
        """Advance every unfinished row of ``rows`` by one draw (plus forced tokens) and score
        ``extra`` prefixes in the same forward pass; returns the extra rows' logits (or None).

        Raises only when the model call itself fails (then every row of the step is failed).
        """
        stepping = []
        for row in rows:
            if row.finish is not None:
                continue
            if len(row.tokens) >= row.options.max_tokens:
                self._finish(row, "length")
            else:
                stepping.append(row)
        if not stepping and not extra:
            return None
        bitmask = allocate_token_bitmask(max(1, len(stepping)), self.vocab.logits_width)
        stepping = self._fill_masks(stepping, bitmask)
        prefixes = [row.prompt + row.tokens for row in stepping] + [list(p) for p in extra]
        if not prefixes:
            return None
        try:
            logits = self.lm.next_logits(prefixes)
        except Exception as exc:  # noqa: BLE001 - the model failed: every row of this step fails
            for row in stepping:
                self.fail(row, exc)
            reset = getattr(self.lm, "reset", None)
            if callable(reset):
                reset()
            raise
        self.forward_calls += 1
        n = len(stepping)
        if n:
            self._premask(stepping, logits, bitmask)
        for k, row in enumerate(stepping):
            try:
                self._append(row, self._choose(row, logits[k]))
            except Exception as exc:  # noqa: BLE001 - e.g. LimitExceeded from a pathological grammar
                self.fail(row, exc)
        return logits[n:] if extra else None

    # --- the pieces of a step (engine.decoding._Loop, per row) ----------------------------------

    def _fill_masks(self, stepping: list[Row], bitmask: np.ndarray) -> list[Row]:
        keep = []
        for row in stepping:
            slot = len(keep)
            try:
                row.matcher.fill_mask(bitmask, slot)
            except Exception as exc:  # noqa: BLE001 - one row's failure never stops the batch
                self.fail(row, exc)
                continue
            words = bitmask[slot]
            if not (words & self.text_words).any():
                if not words.any():
                    self.fail(row, NoAllowedToken(f"the grammar allows no token after {len(row.tokens)} tokens"))
                    continue
                if row.options.fast_forward:  # only EOS is possible: the grammar ends the row
                    self._finish(row, "stop")
                    continue
            keep.append(row)
        return keep

    def _premask(self, stepping: list[Row], logits: torch.Tensor, bitmask: np.ndarray) -> None:
        n = len(stepping)
        if all(row.options.premask for row in stepping):
            apply_token_bitmask_inplace(logits[:n], bitmask[:n])
        else:
            for k, row in enumerate(stepping):
                if row.options.premask:
                    apply_token_bitmask_inplace(logits[k], bitmask[k])
                elif not row.constrained and self.vocab.size < logits.shape[-1]:
                    disallow_tokens_inplace(logits[k], slice(self.vocab.size, None))
        free = [k for k, row in enumerate(stepping) if row.options.ignore_eos and not row.constrained]
        if free:
            disallow_tokens_inplace(logits, sorted(self.eos), rows=free)

    def _choose(self, row: Row, logits: torch.Tensor) -> Draw:
        if row.closing is None or not row.closing.steers(row.matcher):
            return self._draw(row, logits)
        narrowed = row.closing.narrow(row.matcher)
        try:
            draw = self._draw_narrowed(row, logits, narrowed)
        except NoAllowedToken:  # every admitted token has zero probability: closing gives up
            return self._draw(row, logits)
        row.steered += narrowed.refusals > 0
        return draw

    def _draw_narrowed(self, row: Row, logits: torch.Tensor, narrowed: NarrowedMatcher) -> Draw:
        params = row.options.direct_params
        if params is None:
            return row.run.draw(logits, narrowed, row.generator)
        return Draw(token=masked_draw(logits, narrowed, params, row.generator))

    def _draw(self, row: Row, logits: torch.Tensor) -> Draw:
        params = row.options.direct_params
        if params is None:
            return row.run.draw(logits, row.matcher, row.generator)
        scores = logits.detach().float()
        if params.temperature == 0:
            best = int(torch.argmax(scores))
            if scores[best] == float("-inf"):
                raise NoAllowedToken("every token is masked out in this state")
            return Draw(token=best)
        if torch.isneginf(scores).all():
            raise NoAllowedToken("every token is masked out in this state")
        probs = torch.softmax(process_logits(scores, params), dim=-1)
        return Draw(token=sample_categorical(probs, row.generator))

    def _append(self, row: Row, draw: Draw) -> None:
        token = int(draw.token)
        row.log_weight += float(draw.log_weight)
        if token in self.eos:
            row.matcher.advance(token)  # raises TokenRejected if EOS was not allowed
            row.eos_drawn = True
            self._finish(row, "stop")
            return
        row.matcher.advance(token)
        self._push(row, token)
        self._fast_forward(row)

    def _fast_forward(self, row: Row) -> None:
        if row.finish is not None or not row.options.fast_forward:
            return
        for token in row.matcher.forced_tokens(max(0, row.options.max_tokens - len(row.tokens))):
            row.matcher.advance(token)
            row.forced += 1
            self._push(row, token)
            if row.finish is not None:
                break

    def _push(self, row: Row, token: int) -> None:
        before = len(row.text)
        row.tokens.append(token)
        row.text += self.vocab.token_bytes[token] if token < self.vocab.size else b""
        stops = row.options.stop
        if stops:
            encoded = [s.encode("utf-8") for s in stops]
            start = max(0, before - max(map(len, encoded)) + 1)
            hits = [i for i in (row.text.find(s, start) for s in encoded) if i >= 0]
            if hits:
                del row.text[min(hits):]
                self._finish(row, "stop_string")

    def _finish(self, row: Row, reason: str) -> None:
        if row.finish is not None:
            return
        row.finish = reason
        try:
            row.run.finish(list(row.tokens), completed=reason == "stop")
        except Exception:  # noqa: BLE001 - as in cancel()
            log.debug("a sampler's finish() failed", exc_info=True)
