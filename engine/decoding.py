"""The autoregressive loop: mask -> apply to logits -> sample -> advance, for a batch of rows.

The engine owns the loop (STYLE.md anti-patterns: no stateless per-step callback driving a
stateful matcher). One step, for the rows still running:

1. ``Matcher.fill_mask`` writes each row's allowed tokens into one preallocated packed bitmask
   (``[rows, ceil(width/32)]`` int32). A row whose mask holds only EOS is finished here, without
   a model call (the grammar forces the end); a row whose mask is empty is a broken grammar and
   raises ``NoAllowedToken``.
2. One ``LanguageModel.next_logits`` call scores every running row (the model reuses its KV
   cache; fast-forwarded tokens reach it together in one forward pass). With
   ``overlap_masks`` (the default) steps 1 and 2 run at once: the forward pass runs in a worker
   thread while this thread fills the masks (the mask kernels release the GIL, and so do the
   model's kernels). Only an accepting row can be EOS-only (EOS is in the mask exactly when
   ``is_accepting()``), so those few rows are masked *before* the forward starts and the model
   scores exactly the rows the sequential order would give it — the same batch, hence the same
   logits, and still no model call when the grammar ends every row. A row found EOS-only after
   the start anyway (a matcher outside the contract) has its logits row dropped. The model is
   called from one thread at a time: one single-thread executor per ``decode`` call, each call
   joined before the step goes on or an exception leaves it. The time a step spends on masks
   outside the forward pass (masks filled before it starts, plus any still being filled after it
   ends; with the overlap off, all of it) is each row's ``mask_wait_s``.
3. For mask-based samplers the bitmask is applied to the whole batch in place
   (``samplers.kernels``, which owns every write of ``-inf`` into logits); samplers that test
   tokens themselves (AWRS, ASAp) get the raw logits and read the matcher, as the ``samplers``
   contract says. A batch without any constrained row skips steps 1 and 3 (only padding
   columns, and EOS under ``ignore_eos``, are set to ``-inf``).
4. Each row's ``SamplingRun.draw`` picks a token with the row's own ``torch.Generator`` (greedy
   ``direct_params`` take the argmax directly); the matcher advances; stop strings are checked;
   forced tokens are appended without sampling.

Guarantees:

* **EOS only when accepting.** EOS ids are in the mask exactly when ``is_accepting()``
  (grammars' contract); a row ends on EOS with ``finish_reason="stop"``. EOS is not part of
  ``token_ids``.
* **Termination.** At most ``max_tokens`` steps per row, counted with EOS (like transformers'
  ``max_new_tokens``): a row that has produced ``max_tokens`` tokens without EOS ends with
  ``"length"``. Forced tokens count against the budget too.
* **Budget-aware closing.** Each step (or, with ``closing_horizon=N``, each step once the
  remaining budget is within ``N`` tokens) asks a ``ClosingPlanner`` for ``U``: the tokens (EOS
  included) of the shortest completion from the row's state (``Matcher.shortest_completion``:
  the fewest bytes that finish, in the fewest tokens — achievable, exact for byte vocabularies).
  While ``U <= remaining`` the sampler draws from the row's matcher *narrowed* by
  ``engine.closing.BudgetClosing``: only tokens after which a completion still fits
  (``U(after) <= remaining - 1``), and the first token of the planner's completion, are
  admitted. Every sampler draws from that narrowed constraint by its own rules
  (``samplers.narrowing``): the masked sampler and ASAp draw from the grammar mask and ask about
  the drawn token only, drawing again without refused ones — rejection sampling from the
  distribution renormalised over the admitted tokens — and compute the exact narrowed mask after
  ``max_rejections`` refusals; AWRS checks single tokens anyway. The admitted set is never empty
  and following it closes in time, so with the default (no horizon) a length-limited value comes
  back complete whenever the start state's completion fits the budget. When none fits (an
  impossible budget) the row runs unchanged to ``"length"``. ``budget_steered`` counts the steps
  at which the narrowing refused a token the sampler asked about. Cost: one shortest-completion
  query per new state, cached per state by the planner. A learning sampler (ASAp) learns the
  narrowed constraint, which depends on the budget: key its runs by the budget too (``generate``
  does).
* **Forced tokens** (jump-forward): when ``Matcher.forced_tokens()`` is non-empty its tokens are
  appended without sampling. They are canonical by construction: each one is the *only* token
  the mask allows at its step, so every tokenization of every valid continuation starts with
  it — no longer token can merge across its end (such a token would be allowed as well and the
  run would have stopped before it). This is llguidance's hold-back rule in its most
  conservative form: nothing is forced that the model could have spelled differently. Fast-
  forwarding skips the sampler, so it is on only for locally normalised samplers (masked); for
  exact samplers (ASAp, AWRS) whose weights need every step's logits it is off by default.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Literal

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
    sample_categorical,  # the draw MaskedSampler makes; see _Loop._draw
)
from samplers.base import process_logits
from samplers.kernels import disallow_tokens_inplace
from samplers.masked import masked_draw
from samplers.narrowing import NarrowedMatcher

__all__ = ["FinishReason", "DecodeOptions", "SequenceOutput", "decode"]

#: Why a sequence ended: EOS at an accepting state (or a grammar that allows nothing else),
#: the token budget, or a stop string.
FinishReason = Literal["stop", "length", "stop_string"]


@dataclass(frozen=True)
class DecodeOptions:
    """Loop settings. ``max_tokens`` counts EOS; see the module docstring for the rest."""

    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    fast_forward: bool = True
    premask: bool = True
    budget_closing: bool = True
    closing_horizon: int | None = None
    #: refused draws under budget-aware closing before the exact narrowed mask is computed
    max_rejections: int = 16
    #: Unconstrained rows never draw EOS and run to ``max_tokens`` (throughput baselines).
    ignore_eos: bool = False
    #: When set, the loop draws from the premasked logits itself with these parameters — exactly
    #: what ``MaskedSampler(params)`` draws (same ops, same generator), without masking twice.
    direct_params: SamplingParams | None = None
    #: Fill the grammar masks while the forward pass runs in a worker thread (same outputs and
    #: random streams as ``False``, which masks first and then calls the model; benchmarks compare).
    overlap_masks: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {self.max_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty str, got {self.stop!r}")
        if (self.closing_horizon is not None and self.closing_horizon < 0) or self.max_rejections < 0:
            raise ValueError("closing_horizon and max_rejections must be >= 0")
        if self.direct_params is not None and not self.premask:
            raise ValueError("direct_params needs premask=True (it samples the masked logits as they are)")


@dataclass
class SequenceOutput:
    """One row's result: generated tokens (EOS excluded), bytes, and how it ended."""

    token_ids: list[int]
    text: bytes
    finish_reason: FinishReason
    forced_tokens: int = 0
    budget_steered: int = 0
    log_weight: float = 0.0
    first_token_s: float | None = None
    per_token_s: list[float] = field(default_factory=list)
    #: per entry of ``per_token_s``: seconds that step spent on masks outside the forward pass
    mask_wait_s: list[float] = field(default_factory=list)

    @property
    def mask_wait_total_s(self) -> float:
        """Seconds this row's steps spent waiting on masks, in total."""
        return sum(self.mask_wait_s)

    @property
    def mean_mask_wait_s(self) -> float | None:
        """Mean seconds per step spent waiting on masks, or None when no step ran."""
        return self.mask_wait_total_s / len(self.mask_wait_s) if self.mask_wait_s else None


@dataclass
class _Row:
    prompt: list[int]
    matcher: object
    run: SamplingRun
    generator: torch.Generator | None
    constrained: bool
    closing: BudgetClosing | None = None
    tokens: list[int] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    finish: FinishReason | None = None
    forced: int = 0
    steered: int = 0
    log_weight: float = 0.0
    first_token_s: float | None = None
    step_times: list[float] = field(default_factory=list)
    mask_waits: list[float] = field(default_factory=list)


def decode(
    lm: LanguageModel,
    vocab: TokenVocabulary,
    prompts: Sequence[Sequence[int]],
    matchers: Sequence[object],
    runs: Sequence[SamplingRun],
    generators: Sequence[torch.Generator | None],
    options: DecodeOptions = DecodeOptions(),
    *,
    planner: ClosingPlanner | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> list[SequenceOutput]:
    """Generate for every row until EOS, a stop string or ``options.max_tokens``.

    ``matchers[i]`` is a fresh ``Matcher`` (a ``grammars.UnconstrainedMatcher`` for unconstrained rows), and it
    is advanced in place; ``runs[i]`` comes from ``sampler.start(...)``; ``generators[i]`` seeds
    row ``i``'s draws. ``planner`` enables budget-aware closing (``options.budget_closing``).
    ``on_tokens(n)`` is called with the number of tokens each step added (progress bars).

    Raises ``NoAllowedToken`` if a grammar allows no token in a non-terminated state,
    ``grammars.TokenRejected`` if a sampler returns a token outside the mask, and ``ValueError``
    for ``fast_forward`` with a run that must draw every token (ASAp).
    """
    n = len(prompts)
    if not (len(matchers) == len(runs) == len(generators) == n):
        raise ValueError("prompts, matchers, runs and generators must have the same length")
    if options.fast_forward and any(getattr(run, "draws_every_token", False) for run in runs):
        raise ValueError("fast_forward=True cannot be used with a sampler that must draw every token (ASAp): "
                         "forced tokens would bypass it; pass fast_forward=False")
    if lm.logits_width < vocab.size:
        raise ValueError(
            f"the model scores {lm.logits_width} tokens but the tokenizer has {vocab.size}: "
            "the tokenizer does not belong to this model"
        )
    if vocab.logits_width != lm.logits_width:
        raise ValueError(
            f"vocabulary logits_width {vocab.logits_width} != model logits_width {lm.logits_width}; "
            "build the vocabulary with logits_width=lm.logits_width (padded output layers)"
        )
    closing = planner if options.budget_closing else None
    rows = []
    for p, m, r, g in zip(prompts, matchers, runs, generators):
        constrained = not isinstance(m, UnconstrainedMatcher)
        rows.append(_Row(list(p), m, r, g, constrained, _closing(closing, m, options) if constrained else None))
    loop = _Loop(lm, vocab, options, on_tokens)
    loop.run(rows)
    return [
        SequenceOutput(
            token_ids=r.tokens,
            text=bytes(r.text),
            finish_reason=r.finish or "length",
            forced_tokens=r.forced,
            budget_steered=r.steered,
            log_weight=r.log_weight,
            first_token_s=r.first_token_s,
            per_token_s=r.step_times,
            mask_wait_s=r.mask_waits,
        )
        for r in rows
    ]


def _closing(planner: ClosingPlanner | None, matcher, options: DecodeOptions) -> BudgetClosing | None:
    """The row's budget-aware closing rule (``None``: closing off or no planner)."""
    if planner is None:
        return None
    return BudgetClosing(planner, matcher.num_consumed + options.max_tokens, horizon=options.closing_horizon,
                         lazy_checks=options.max_rejections)


#: One step's model call: the rows kept, their logits (None when no row is kept), the mask wait.
_Step = tuple[list[_Row], torch.Tensor | None, float]


def _prefixes(rows: list[_Row]) -> list[list[int]]:
    """What the model scores for ``rows``: prompt and generated tokens (new lists, never shared)."""
    return [row.prompt + row.tokens for row in rows]


def _may_accept(matcher) -> bool:
    """Whether the matcher's mask may hold EOS (the contract: exactly when ``is_accepting()``); a
    matcher that cannot tell is assumed to."""
    accepting = getattr(matcher, "is_accepting", None)
    return accepting is None or bool(accepting())


class _Forward:
    """The model calls of one loop run, in a single worker thread so that masks fill meanwhile.

    The model is not thread-safe: one executor with one thread per run, and every call is joined
    (``Future.result`` or a wait) before the next starts, so the model never runs twice at once.
    Torch's grad and inference modes and the current CUDA stream are per thread: the caller's
    are carried into the worker (so its kernels stay ordered with the masking that follows).
    """

    def __init__(self, lm):
        self.lm = lm
        self._pool: ThreadPoolExecutor | None = None

    def start(self, prefixes: list[list[int]]) -> Future:
        """``lm.next_logits(prefixes)`` in the worker; the future answers ``(logits, end time)``."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-forward")
        stream = torch.cuda.current_stream() if torch.cuda.is_initialized() else None
        return self._pool.submit(self._call, prefixes, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                                 stream)

    def _call(self, prefixes, grad: bool, inference: bool, stream) -> tuple[torch.Tensor, float]:
        on_stream = torch.cuda.stream(stream) if stream is not None else nullcontext()
        with torch.inference_mode(inference), torch.set_grad_enabled(grad), on_stream:
            logits = self.lm.next_logits(prefixes)
        return logits, time.perf_counter()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class _Loop:
    def __init__(self, lm, vocab: TokenVocabulary, options: DecodeOptions, on_tokens):
        self.lm = lm
        self.vocab = vocab
        self.opt = options
        self.on_tokens = on_tokens
        self.eos = vocab.eos_token_ids
        eos_bool = np.zeros(vocab.logits_width, dtype=bool)
        eos_bool[list(self.eos)] = True
        self.text_words = ~pack_bool(eos_bool, vocab.logits_width)
        self.stop = [s.encode("utf-8") for s in options.stop]
        self.longest_stop = max((len(s) for s in self.stop), default=0)

    def run(self, rows: list[_Row]) -> None:
        forward = _Forward(self.lm)
        try:
            self._run(rows, forward)
        finally:
            forward.close()  # joins the worker: no model call outlives the loop

    def _run(self, rows: list[_Row], forward: _Forward) -> None:
        bitmask = allocate_token_bitmask(len(rows), self.vocab.logits_width)
        started = time.perf_counter()
        last = started
        forced = sum(self._fast_forward(row) for row in rows)  # a grammar may force its first tokens
        if self.on_tokens is not None and forced:
            self.on_tokens(forced)
        while True:
            stepping = []
            for row in rows:
                if row.finish is not None:
                    continue
                if len(row.tokens) >= self.opt.max_tokens:
                    self._finish(row, "length")
                else:
                    stepping.append(row)
            if not stepping:
                return
            if any(row.constrained for row in stepping):
                if self.opt.overlap_masks:
                    stepping, logits, mask_wait = self._masks_during_forward(stepping, bitmask, forward)
                else:
                    stepping, logits, mask_wait = self._masks_then_forward(stepping, bitmask)
                if not stepping:
                    continue
                if self.opt.premask:
                    apply_token_bitmask_inplace(logits, bitmask[: len(stepping)])
            else:  # no grammar in the batch: no masks, just the padding columns (and EOS) out
                logits = self.lm.next_logits(_prefixes(stepping))
                mask_wait = 0.0
                if self.vocab.size < logits.shape[-1]:
                    disallow_tokens_inplace(logits, slice(self.vocab.size, None))
            if self.opt.ignore_eos:
                free = [k for k, row in enumerate(stepping) if not row.constrained]
                if free:
                    disallow_tokens_inplace(logits, sorted(self.eos), rows=free)
            added = 0
            now = None
            for k, row in enumerate(stepping):
                draw = self._choose(row, logits[k])
                now = time.perf_counter()
                added += self._append(row, draw, now - started)
            assert now is not None
            for row in stepping:
                row.step_times.append(now - last)
                row.mask_waits.append(mask_wait)
            last = now
            if self.on_tokens is not None and added:
                self.on_tokens(added)

    # --- one step ---------------------------------------------------------------------------

    def _masks_then_forward(self, stepping: list[_Row], bitmask: np.ndarray) -> _Step:
        """Sequential order: every mask, then the model for the rows the masks kept.
        Returns ``(kept rows, their logits or None when none is kept, mask wait)``."""
        t0 = time.perf_counter()
        keep = []
        for row in stepping:
            if self._mask_row(row, bitmask, len(keep)):
                keep.append(row)
        mask_wait = time.perf_counter() - t0  # the forward waited for all of it
        return keep, (self.lm.next_logits(_prefixes(keep)) if keep else None), mask_wait

    def _masks_during_forward(self, stepping: list[_Row], bitmask: np.ndarray, forward: _Forward) -> _Step:
        """``_masks_then_forward``'s result, with the masks filled while the forward pass runs.

        Rows that may be EOS-only are masked first, into the slot they keep (the worker never
        touches the bitmask), so the forward gets exactly the rows the sequential order would give it.
        """
        t0 = time.perf_counter()
        early: set[int] = set()  # slots masked before the forward
        keep = []
        for row in stepping:
            if self.opt.fast_forward and row.constrained and _may_accept(row.matcher):
                if not self._mask_row(row, bitmask, len(keep)):
                    continue
                early.add(len(keep))
            keep.append(row)
        if not keep:  # the grammar ended every row: no model call
            return keep, None, time.perf_counter() - t0
        before = time.perf_counter() - t0
        pending = forward.start(_prefixes(keep))
        try:
            dropped = []
            for slot, row in enumerate(keep):
                if slot not in early and not self._mask_row(row, bitmask, slot):
                    dropped.append(slot)
            masks_done = time.perf_counter()
        except BaseException:
            wait_for([pending])  # the model call ends before the error leaves the step
            raise
        logits, forward_done = pending.result()
        mask_wait = before + max(0.0, masks_done - forward_done)
        if dropped:  # EOS-only after all (a matcher that could not tell in advance): drop its logits row
            kept = sorted(set(range(len(keep))) - set(dropped))
            bitmask[: len(kept)] = bitmask[kept]
            logits = logits.index_select(0, torch.tensor(kept, dtype=torch.long, device=logits.device))
            keep = [keep[slot] for slot in kept]
        return keep, logits, mask_wait

    def _mask_row(self, row: _Row, bitmask: np.ndarray, slot: int) -> bool:
        """Fill ``row``'s mask into ``bitmask[slot]``; ``False`` when the mask ended the row (EOS only)."""
        row.matcher.fill_mask(bitmask, slot)
        words = bitmask[slot]
        if not (words & self.text_words).any():
            if not words.any():
                raise NoAllowedToken(
                    f"the grammar allows no token after {len(row.tokens)} generated tokens "
                    "(and EOS is not allowed either); this is a bug in the grammar engine"
                )
            if self.opt.fast_forward:  # only EOS is possible: the grammar ends the row
                self._finish(row, "stop")
                return False
        return True

    def _choose(self, row: _Row, logits: torch.Tensor) -> Draw:
        """The row's next token: from its matcher, narrowed by budget-aware closing when it steers."""
        if row.closing is None or not row.closing.steers(row.matcher):
            return self._draw(row, logits)
        narrowed = row.closing.narrow(row.matcher)
        try:
            draw = self._draw_narrowed(row, logits, narrowed)
        except NoAllowedToken:  # the model gives every admitted token zero probability: closing gives up
            return self._draw(row, logits)
        row.steered += narrowed.refusals > 0
        return draw

    def _draw_narrowed(self, row: _Row, logits: torch.Tensor, narrowed: NarrowedMatcher) -> Draw:
        params = self.opt.direct_params
        if params is None:
            return row.run.draw(logits, narrowed, row.generator)
        return Draw(token=masked_draw(logits, narrowed, params, row.generator))  # what MaskedSampler draws

    def _draw(self, row: _Row, logits: torch.Tensor) -> Draw:
        params = self.opt.direct_params
        if params is None:
            return row.run.draw(logits, row.matcher, row.generator)
        scores = logits.detach().float()
        if params.temperature == 0:  # greedy: the argmax process_logits would keep, without the softmax
            best = int(torch.argmax(scores))
            if scores[best] == float("-inf"):
                raise NoAllowedToken("every token is masked out in this state")
            return Draw(token=best)
        if torch.isneginf(scores).all():
            raise NoAllowedToken("every token is masked out in this state")
        probs = torch.softmax(process_logits(scores, params), dim=-1)
        # the same ops as MaskedSampler.draw minus its second masking; a test pins the equivalence
        return Draw(token=sample_categorical(probs, row.generator))

    def _append(self, row: _Row, draw: Draw, elapsed: float) -> int:
        """Consume a drawn token (and any forced ones after it); returns tokens added."""
        token = int(draw.token)
        row.log_weight += float(draw.log_weight)
        if row.first_token_s is None:
            row.first_token_s = elapsed
        if token in self.eos:
            row.matcher.advance(token)  # raises TokenRejected if EOS was not allowed
            self._finish(row, "stop")
            return 0
        row.matcher.advance(token)
        self._push(row, token)
        return 1 + self._fast_forward(row)

    def _fast_forward(self, row: _Row) -> int:
        """Append the tokens the grammar forces from here (within the budget); returns how many."""
        if row.finish is not None or not self.opt.fast_forward:
            return 0
        added = 0
        for token in row.matcher.forced_tokens(max(0, self.opt.max_tokens - len(row.tokens))):
            row.matcher.advance(token)
            row.forced += 1
            added += 1
            self._push(row, token)
            if row.finish is not None:
                break
        return added

    def _push(self, row: _Row, token: int) -> None:
        before = len(row.text)
        row.tokens.append(token)
        row.text += self.vocab.token_bytes[token] if token < self.vocab.size else b""
        if self.stop:
            start = max(0, before - self.longest_stop + 1)
            hits = [i for i in (row.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                del row.text[min(hits) :]
                self._finish(row, "stop_string")

    def _finish(self, row: _Row, reason: FinishReason) -> None:
        row.finish = reason
        row.run.finish(list(row.tokens), completed=reason == "stop")

