"""Constrained decoding for masked-diffusion LMs: a canvas of masked positions, filled in steps.

The canvas is ``prompt + [MASK] * canvas_length``; it is decoded in semi-autoregressive blocks
(``block_length``), each in a share of ``steps`` model calls. Every step the model scores every
position, an *unmasking policy* picks which masked positions of the current block to commit
(``FixedCount``: LLaDA's low-confidence remasking, k per step; ``ConfidenceThreshold``: every
position whose top token is likely enough; ``EntropyBounded``: lowest-entropy positions while
their entropies sum below a bound — each at least one position per step), and the constraint
decides *what* they get, jointly, never one position at a time:

* ``"dingo"`` (regular constraints: regexes, JSON Schemas whose language is regular): the block's
  most probable valid assignment (``samplers.dingo_map``) over the token DFA, the positions not
  chosen this step staying masked ("any token"), ending where acceptance is reachable within the
  canvas positions after the block; the chosen positions take its tokens. Temperature > 0 samples
  (``samplers.dingo_sample``).
* ``"infill"`` (any grammar): the chosen positions' proposals are committed together when the
  canvas — committed runs as fixed texts, masked runs as holes of at least as many bytes as
  they have positions (a position before a committed token cannot be EOS padding) — is still
  completable (``CompiledGrammar.completable``); else one at a time in order of confidence, a
  refused token removed from its position and the position redrawn (``max_resamples``), which
  keeps a maximal valid subset of the proposals rather than dropping them all. When none of the
  chosen positions can be committed, the block's other masked positions are tried the same way,
  so a step commits nothing only when no masked position of its block has a completable draw;
  the block then ends (the next model call would see the same canvas: commits only narrow the
  language, never widen it). Holes left when the steps run out are closed with the shortest
  witness fill (``complete``), token-exact: spelled in exactly the positions of its run (the last
  run before the end may also take the EOS padding after it), the model's commit next to a run
  masked again when no fill fits (``reopened``); the result says how many bytes and positions the
  witness wrote. Only a canvas whose *given* positions leave no room returns a text longer than
  the canvas (``overflow``).
* ``"greedy"``: the baseline the papers compare with — a position is masked by the prefix
  automaton only when everything to its left is committed, otherwise it is unconstrained.
* ``"none"``: unconstrained.

Tokens after an EOS are EOS (the canvas tail is padding); the text is everything before the
first EOS. ``output_prefix``: tokens the constraint reads before the canvas (the end of the
prompt when the output continues a text of the language, e.g. a function body after its
declaration); the text returned is the canvas' alone.

Counting: ``committed_per_step`` has one entry per model call, the positions that call's commits
decided (EOS padding and witness fills excluded), so ``tokens_per_step`` is model-committed
positions per model call; ``positions_per_call`` also counts the EOS padding an EOS commit
implies and the positions a witness closed, i.e. canvas positions decided per model call.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence

import numpy as np
import torch

from grammars import CompiledGrammar
from grammars.automata.holes import PrefixChart
from grammars.errors import LimitExceeded
from grammars.bitmask import allocate_token_bitmask
from grammars.vocab.spelling import Spelling
from grammars.vocab.vocabulary import TokenVocabulary
from samplers.kernels import apply_token_bitmask_inplace

__all__ = [
    "DiffusionResult",
    "UnmaskingPolicy",
    "FixedCount",
    "ConfidenceThreshold",
    "EntropyBounded",
    "diffusion_decode",
    "canvas_parts",
]

ConstraintMode = Literal["auto", "dingo", "infill", "greedy", "none"]


class UnmaskingPolicy(Protocol):
    """Which of a block's masked positions to commit this step (at least one)."""

    def choose(self, confidence: np.ndarray, entropy: np.ndarray, steps_left: int) -> np.ndarray:
        """Indices into ``confidence``/``entropy`` (one entry per masked position of the block)."""
        ...


@dataclass(frozen=True)
class FixedCount:
    """LLaDA's low-confidence remasking: the ``ceil(masked / steps_left)`` most confident positions."""

    def choose(self, confidence: np.ndarray, entropy: np.ndarray, steps_left: int) -> np.ndarray:
        k = max(1, math.ceil(len(confidence) / max(1, steps_left)))
        return np.argsort(-confidence, kind="stable")[:k]


@dataclass(frozen=True)
class ConfidenceThreshold:
    """Every position whose top probability reaches ``threshold`` (at least the most confident one,
    and at least as many as ``FixedCount`` so the block finishes within its steps)."""

    threshold: float = 0.9

    def choose(self, confidence: np.ndarray, entropy: np.ndarray, steps_left: int) -> np.ndarray:
        order = np.argsort(-confidence, kind="stable")
        k = max(int((confidence >= self.threshold).sum()), math.ceil(len(confidence) / max(1, steps_left)), 1)
        return order[:k]


@dataclass(frozen=True)
class EntropyBounded:
    """Lowest-entropy positions first while their entropies sum to at most ``bound`` nats (EB-sampler)."""

    bound: float = 1.0

    def choose(self, confidence: np.ndarray, entropy: np.ndarray, steps_left: int) -> np.ndarray:
        order = np.argsort(entropy, kind="stable")
        total = np.cumsum(entropy[order])
        k = max(int((total <= self.bound).sum()), math.ceil(len(entropy) / max(1, steps_left)), 1)
        return order[:k]


POLICIES = {"confidence": FixedCount, "threshold": ConfidenceThreshold, "entropy": EntropyBounded}


def resolve_policy(unmasking: Any) -> UnmaskingPolicy:
    if isinstance(unmasking, str):
        if unmasking not in POLICIES:
            raise ValueError(f"unmasking must be one of {sorted(POLICIES)} or a policy object, got {unmasking!r}")
        return POLICIES[unmasking]()
    if not callable(getattr(unmasking, "choose", None)):
        raise TypeError(f"unmasking must name a policy or have choose(confidence, entropy, steps_left); "
                        f"got {type(unmasking).__name__}")
    return unmasking


@dataclass
class DiffusionResult:
    """A decoded canvas: the text, its tokens, and what the decoding cost."""

    text: bytes
    token_ids: list[int]
    model_calls: int = 0
    committed_per_step: list[int] = field(default_factory=list)
    constraint_seconds: float = 0.0
    checks: int = 0
    refused: int = 0
    undecided: int = 0  # checks that hit a Limits bound: counted as refusals, never accepted unverified
    witness_bytes: int = 0  # bytes a witness fill wrote to close holes the steps left open
    witness_positions: int = 0  # masked positions (before the end) that witness fill closed
    padded: int = 0  # masked positions set to EOS because an EOS was committed before them
    #: tokens the text has beyond the canvas: no witness fill fitted the positions left (0: none)
    overflow: int = 0
    reopened: int = 0  # committed positions masked again so that a witness fill fits the positions
    #: the output prefix and the text are a complete sentence of the constraint, checked by a matcher
    #: (an independent parser) after decoding; None in the modes that promise nothing ("none",
    #: "greedy"). False only when closing the canvas failed (a parser limit during the witness):
    #: the text is then cut short, never passed off as complete (``finish_reason`` "length").
    complete: bool | None = None
    #: the bytes of each canvas position's token, b"" after the end (with an ``overflow``, a fill on
    #: the first position of the run it closed and b"" on the rest): what infilling reads fills from
    position_bytes: list[bytes] = field(default_factory=list, repr=False)

    @property
    def finish_reason(self) -> str:
        """"stop" when the text is complete — in a constrained mode when the matcher accepts it
        (``complete``), otherwise when the model wrote EOS before the canvas ran out — else "length"."""
        if self.complete is not None:
            return "stop" if self.complete else "length"
        return "stop" if len(self.token_ids) < len(self.position_bytes) else "length"

    @property
    def tokens_per_step(self) -> float:
        """Positions committed by model calls, per model call (padding and witness fills excluded)."""
        return sum(self.committed_per_step) / max(1, len(self.committed_per_step))

    @property
    def positions_per_call(self) -> float:
        """Canvas positions decided per model call: commits, the EOS padding they imply and witness fills."""
        decided = sum(self.committed_per_step) + self.padded + self.witness_positions
        return decided / max(1, len(self.committed_per_step))


def canvas_parts(tokens: Sequence[int], mask_id: int, eos: frozenset[int], vocab: TokenVocabulary
                 ) -> tuple[list[bytes], list[tuple[int, int | None]]]:
    """The canvas as fixed texts and holes: committed runs are texts, masked runs holes of at least
    as many bytes as positions when a committed token follows (EOS padding only at the end), of
    any length otherwise; everything from the first committed EOS on is the end."""
    parts: list[bytes] = [b""]
    holes: list[tuple[int, int | None]] = []
    run = 0
    for token in tokens:
        if token in eos:
            break
        if token == mask_id:
            run += 1
            continue
        if run:
            holes.append((run, None))
            parts.append(b"")
            run = 0
        parts[-1] += vocab.token_bytes[token]
    if run:  # masked positions before the end may all turn out to be padding
        holes.append((0, None))
        parts.append(b"")
    return parts, holes


def diffusion_decode(
    lm, vocab: TokenVocabulary, prompt_ids: list[int], compiled: CompiledGrammar | None, *,
    canvas_length: int = 128, steps: int = 64, block_length: int | None = None, unmasking: Any = "confidence",
    mode: ConstraintMode = "auto", temperature: float = 0.0, max_resamples: int = 20,
    generator: torch.Generator | None = None, canvas: Sequence[int] | None = None,
    output_prefix: Sequence[int] = (),
) -> DiffusionResult:
    """Decode one canvas (see the module docstring). ``canvas``: a partly filled canvas to
    complete instead of an all-masked one (the model's mask id where a position is open; its
    length is the canvas length): infilling with a diffusion model. ``output_prefix``: token ids
    the constraint reads before the canvas (usually the prompt's end); they must start a text of
    the language."""
    if canvas is not None:
        canvas = [int(t) for t in canvas]
        canvas_length = len(canvas)
    for name, value in (("canvas_length", canvas_length), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    block = canvas_length if block_length is None else block_length
    if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= canvas_length:
        raise ValueError(f"block_length must be an int in 1..canvas_length, got {block_length!r}")
    if mode == "auto":
        mode = "none" if compiled is None else ("dingo" if compiled.is_regular else "infill")
    if mode not in ("dingo", "infill", "greedy", "none"):
        raise ValueError(f"mode must be auto, dingo, infill, greedy or none; got {mode!r}")
    if mode != "none" and compiled is None:
        raise ValueError(f"mode={mode!r} needs a constraint")
    if mode == "dingo" and not compiled.is_regular:
        raise ValueError("mode='dingo' needs a regular constraint; use 'infill' for context-free grammars")
    prefix = [int(t) for t in output_prefix]
    if prefix and mode != "none" and not compiled.completable([vocab.decode(prefix), b""]):
        raise ValueError("output_prefix does not start any text of the constraint's language")
    run = _Canvas(lm, vocab, prompt_ids, compiled, canvas_length, resolve_policy(unmasking), mode, temperature,
                  max_resamples, generator, prefix)
    if canvas is not None:
        run.tokens = canvas
        run.given = frozenset(i for i, t in enumerate(canvas) if t != run.mask)
    n_blocks = math.ceil(canvas_length / block)
    per_block = max(1, steps // n_blocks)
    for b in range(n_blocks):
        start, end = b * block, min(canvas_length, (b + 1) * block)
        stuck = False
        for step in range(per_block):
            if not run.masked(start, end):
                break
            if not run.step(start, end, per_block - step):
                stuck = True  # every masked position of the block was tried: the witness closes it
                break
        while not stuck and run.masked(start, end):  # out of steps: the rest of the block, one more step each
            if not run.step(start, end, 1):
                break
    return run.finish()


class _Canvas:
    def __init__(self, lm, vocab, prompt_ids, compiled, length, policy, mode, temperature, max_resamples, generator,
                 prefix=()):
        self.lm, self.vocab, self.compiled = lm, vocab, compiled
        self.prefix = list(prefix)  # what the constraint reads before the canvas
        self.prefix_bytes = vocab.decode(self.prefix) if self.prefix else b""
        # an empty prompt starts from EOS (a document boundary): the canvas always follows a token
        self.prompt = list(prompt_ids) or [min(vocab.eos_token_ids)]
        self.mask = int(lm.mask_token_id)
        self.eos = frozenset(vocab.eos_token_ids)
        self.eos_id = min(vocab.eos_token_ids)
        self.tokens = [self.mask] * length
        self.policy, self.mode, self.temperature = policy, mode, temperature
        self.max_resamples, self.generator = max_resamples, generator
        self.result = DiffusionResult(b"", [])
        self.width = vocab.logits_width
        self.dfa = compiled.as_dfa() if mode == "dingo" else None
        # a token without bytes other than EOS would leave a position empty: holes assume each
        # position before a committed token holds at least one byte, so constrained modes drop them
        self.no_bytes = [i for i, b in enumerate(vocab.token_bytes) if not b and i not in self.eos]
        self._prefix_chart: PrefixChart | None = None
        self.given: frozenset[int] = frozenset()  # positions a partly filled canvas came with

    def masked(self, start: int, end: int) -> list[int]:
        return [i for i in range(start, end) if self.tokens[i] == self.mask]

    # --- one step --------------------------------------------------------------------------

    def step(self, start: int, end: int, steps_left: int) -> bool:
        """One model call and the commits it leads to; False when nothing could be committed."""
        logits = self.lm.canvas_logits([self.prompt + self.tokens])[0, len(self.prompt):].float()
        self.result.model_calls += 1
        logits = logits[:, : self.width]
        if self.vocab.size < self.width:
            logits[:, self.vocab.size:] = float("-inf")
        if self.mask < self.width:
            logits[:, self.mask] = float("-inf")
        if self.mode != "none" and self.no_bytes:
            logits[:, self.no_bytes] = float("-inf")
        masked = self.masked(start, end)
        logp = torch.log_softmax(logits, dim=-1)
        probs = logp.exp()
        top = probs[masked].max(dim=-1).values.numpy()
        entropy = -(probs[masked] * torch.nan_to_num(logp[masked], neginf=0.0)).sum(dim=-1).numpy()
        chosen = [masked[i] for i in self.policy.choose(top, entropy, steps_left)]
        t0 = time.perf_counter()
        if self.mode == "dingo":
            committed = self._dingo(logp, start, end, chosen)
        elif self.mode == "infill":
            committed = self._infill(logp, chosen, masked)
        elif self.mode == "greedy":
            committed = self._greedy(logp, chosen)
        else:
            committed = self._commit({i: self._draw(logp[i]) for i in chosen})
        if self.mode != "none":
            self.result.constraint_seconds += time.perf_counter() - t0
        self.result.committed_per_step.append(committed)
        return committed > 0

    def _draw(self, row: torch.Tensor) -> int:
        if self.temperature == 0:
            return int(torch.argmax(row))
        weights = torch.softmax(row / self.temperature, dim=-1)
        return int(torch.multinomial(weights, 1, generator=self.generator))

    def _commit(self, choice: dict[int, int]) -> int:
        for i, token in choice.items():
            self.tokens[i] = token
        self._pad_after_eos()
        return len(choice)

    def _pad_after_eos(self) -> None:
        first = next((i for i, t in enumerate(self.tokens) if t in self.eos), None)
        if first is not None:
            for i in range(first + 1, len(self.tokens)):
                if self.tokens[i] == self.mask:  # positions given in a partly filled canvas stay
                    self.tokens[i] = self.eos_id
                    self.result.padded += 1

    # --- regular: DINGO --------------------------------------------------------------------

    def _dingo(self, logp: torch.Tensor, start: int, end: int, chosen: list[int]) -> int:
        from samplers import dingo_map, dingo_sample

        state = self._dfa_state(start)
        block = logp[start:end].clone()
        keep_masked = np.zeros(end - start, dtype=bool)
        chosen_set = set(chosen)
        for i in range(start, end):
            token = self.tokens[i]
            if token != self.mask:  # committed earlier: forced
                row = torch.full_like(block[i - start], float("-inf"))
                row[token] = 0.0
                block[i - start] = row
            elif i not in chosen_set:
                keep_masked[i - start] = True
        remaining = len(self.tokens) - end
        if self.temperature == 0:
            tokens, _, _ = dingo_map(self.dfa, block, start_state=state, keep_masked=keep_masked, remaining=remaining)
        else:
            tokens, _, _ = dingo_sample(self.dfa, block, start_state=state, keep_masked=keep_masked,
                                        remaining=remaining, temperature=self.temperature, generator=self.generator)
        self.result.checks += 1
        return self._commit({i: int(tokens[i - start]) for i in chosen})

    def _dfa_state(self, start: int) -> int | None:
        """The token DFA's state after the committed positions before ``start`` (None: its start;
        ``ENDED`` once an EOS is among them)."""
        from samplers.dingo import ENDED

        if start == 0 and not self.prefix:
            return None
        matcher = self.dfa.matcher()
        for token in self.prefix + self.tokens[:start]:
            if token in self.eos:
                return ENDED
            matcher.advance(token)
        return matcher.state

    # --- context-free: completability checks -------------------------------------------------

    def _parts(self, tokens: list[int]) -> tuple[list[bytes], list[tuple[int, int | None]]]:
        """``canvas_parts`` with the output prefix in front of the first fixed text."""
        parts, holes = canvas_parts(tokens, self.mask, self.eos, self.vocab)
        parts[0] = self.prefix_bytes + parts[0]
        return parts, holes

    def _completable(self, tokens: list[int]) -> bool:
        parts, holes = self._parts(tokens)
        self.result.checks += 1
        if self._prefix_chart is None:  # the canvas's committed left part is parsed once, not per check
            self._prefix_chart = PrefixChart(self.compiled.hole_grammar, self.compiled._runtime.limits)
        try:
            return self._prefix_chart.completable(parts, holes)
        except LimitExceeded:  # undecided within Limits: the proposal is refused, as infill does
            self.result.undecided += 1
            return False

    def _valid_eos(self, tokens: list[int], i: int) -> bool:
        return all(t == self.mask or t in self.eos for t in tokens[i + 1:])

    def _infill(self, logp: torch.Tensor, chosen: list[int], masked: list[int]) -> int:
        """The chosen proposals jointly; refused, a maximal valid subset of them, one position at a
        time by confidence; none of them, the first other masked position of the block that can be."""
        proposal = {i: self._draw(logp[i]) for i in chosen}
        trial = list(self.tokens)
        for i, token in proposal.items():
            trial[i] = token
        if all(t not in self.eos or self._valid_eos(trial, i) for i, t in proposal.items()) and self._completable(trial):
            return self._commit(proposal)
        confidence = logp.max(dim=-1).values
        committed = sum(self._commit_one(logp, i, first=proposal[i])
                        for i in sorted(chosen, key=lambda i: -float(confidence[i])))
        if committed:
            return committed
        chosen_set = set(chosen)  # widening costs at most what a last step (every position chosen) would
        for i in sorted((i for i in masked if i not in chosen_set), key=lambda i: -float(confidence[i])):
            if self._commit_one(logp, i):
                return 1
        return 0

    def _commit_one(self, logp: torch.Tensor, i: int, first: int | None = None) -> int:
        """Commit position ``i`` alone: ``first`` (or a draw), then redraws without the refused
        tokens, up to ``max_resamples`` checks; 1 when one was committed."""
        if self.tokens[i] != self.mask:  # padded after an EOS committed earlier this step
            return 0
        row = logp[i].clone()
        for attempt in range(self.max_resamples):
            token = first if attempt == 0 and first is not None else self._draw(row)
            if not math.isfinite(float(row[token])):
                return 0
            trial = list(self.tokens)
            trial[i] = token
            if (token not in self.eos or self._valid_eos(trial, i)) and self._completable(trial):
                return self._commit({i: token})
            row[token] = float("-inf")
            self.result.refused += 1
        return 0

    # --- baseline -----------------------------------------------------------------------------

    def _greedy(self, logp: torch.Tensor, chosen: list[int]) -> int:
        choice = {}
        for i in sorted(chosen):
            if any(t == self.mask for t in self.tokens[:i]) or any(t in self.eos for t in self.tokens[:i]):
                choice[i] = self._draw(logp[i])
                continue
            matcher = self.compiled.matcher()
            ok = True
            for token in self.prefix + self.tokens[:i]:
                if not matcher.allows(token):
                    ok = False
                    break
                matcher.advance(token)
            row = logp[i].clone()
            if ok:
                words = allocate_token_bitmask(1, self.width)
                matcher.fill_mask(words, 0)
                apply_token_bitmask_inplace(row, words[0])
                if torch.isneginf(row).all():
                    row = logp[i].clone()
            choice[i] = self._draw(row)
            self.tokens[i] = choice[i]
        return self._commit(choice)

    # --- the end ------------------------------------------------------------------------------

    def finish(self) -> DiffusionResult:
        result = self._finish()
        if self.mode in ("dingo", "infill"):  # the modes that promise a sentence of the language
            result.complete = self._accepts(result.token_ids)
        return result

    def _accepts(self, tokens: list[int]) -> bool:
        matcher = self.compiled.matcher()
        try:
            ids = self.prefix + list(tokens)
            return matcher.try_advance(ids) == len(ids) and matcher.is_accepting()
        except LimitExceeded:
            return False

    def _finish(self) -> DiffusionResult:
        overflow = None
        if self.mode == "infill" and self.mask in self.tokens[:self._end()]:
            overflow = self._close_with_witness()
        tokens = self.tokens
        end = self._end()
        pieces = [self.vocab.token_bytes[t] if i < end and t != self.mask else b"" for i, t in enumerate(tokens)]
        if overflow is not None:  # no fill fits the positions: the text is longer than the canvas
            runs, _ = self._open_runs()
            for (i, _), fill in zip(runs, overflow):  # canvas_parts' holes are the masked runs, in order
                pieces[i] = fill
            self.result.witness_bytes = sum(len(f) for f in overflow)
            self.result.witness_positions = sum(j - i for i, j in runs)
            text = b"".join(pieces)
            self.result.token_ids = self.vocab.encode(text.decode("utf-8"))
            self.result.overflow = max(1, len(self.result.token_ids) - len(tokens))
            self.result.text, self.result.position_bytes = text, pieces
            return self.result
        body = [t for t in tokens[:end] if t != self.mask]
        self.result.token_ids = body
        self.result.text = self.vocab.decode(body)
        self.result.position_bytes = pieces
        return self.result

    def _end(self) -> int:
        return next((i for i, t in enumerate(self.tokens) if t in self.eos), len(self.tokens))

    def _close_with_witness(self) -> list[bytes] | None:
        """Close the masked runs before the end with the fewest-byte witness, token-exact: a run
        between committed tokens takes exactly as many tokens as it has positions; the last run
        before the end may also take the EOS padding after it (positions the canvas was not given),
        fewest tokens first, EOS after.

        The decoder's checks bound holes in bytes, so a run can be left that no fill spells in its
        positions (two committed bytes of one character with one position between them). Then
        the committed token next to the run that did not fit is masked again — the model's commit,
        never a position the canvas was given — and the witness retried: remasking, as diffusion
        samplers do, here only where the constraint needs room. Written into the canvas: None.
        No room left to open: the unbounded fills, which ``finish`` returns as a text longer than
        the canvas (``DiffusionResult.overflow``)."""
        fills = None
        for _ in range(len(self.tokens) + 1):
            runs, room = self._open_runs()
            spelled, fills, misfit = self._fit(runs, room)
            if spelled is not None:
                end = self._end()
                self._write_fills(runs, spelled, end + room if runs[-1][1] == end else runs[-1][1])
                self.result.witness_bytes = sum(len(f) for f in fills)
                self.result.witness_positions = sum(j - i for i, j in runs)
                return None
            if misfit is None or not self._reopen(runs[misfit]):
                return fills
        return fills

    def _open_runs(self) -> tuple[list[tuple[int, int]], int]:
        """The masked runs before the end as (first, past-last) positions, and how many EOS
        positions after the end the last run may take (when it reaches the end)."""
        end = self._end()
        runs: list[tuple[int, int]] = []
        for i in range(end):
            if self.tokens[i] == self.mask:
                if runs and runs[-1][1] == i:
                    runs[-1] = (runs[-1][0], i + 1)
                else:
                    runs.append((i, i + 1))
        room = 0
        if runs and runs[-1][1] == end:
            while end + room < len(self.tokens) and self.tokens[end + room] in self.eos and end + room not in self.given:
                room += 1
        return runs, room

    def _fit(self, runs: list[tuple[int, int]], room: int):
        """(tokens per run, fills, None) for a witness that fits the positions, else (None, the
        unbounded fills, the first run they did not fit or None). The fewest-byte fills first
        (usually they fit), then interior runs held to a byte per position, which a vocabulary
        spelling every byte always fits (the last run's fewest bytes are its fewest already)."""
        parts, holes = self._parts(self.tokens)
        spelling = Spelling.of_vocabulary(self.vocab)
        tight = [(lo, lo) if lo else (0, None) for lo, _ in holes]
        misfit, loose = None, None
        for bounds in [holes] + ([tight] if tight != holes else []):
            try:
                fills = self.compiled.complete(parts, hole_bytes=bounds)
            except LimitExceeded:
                fills = None
            if fills is None:
                continue
            spelled = []
            for k, (fill, (lo, _), (i, j)) in enumerate(zip(fills, holes, runs)):
                tokens = spelling.exactly(fill, j - i) if lo else spelling.fewest(fill)
                if tokens is None or len(tokens) > (j - i) + (0 if lo else room):
                    misfit = k if misfit is None else misfit
                    break
                spelled.append(tokens)
            else:
                return spelled, fills, None
            loose = fills if loose is None else loose
        return None, loose, misfit

    def _reopen(self, run: tuple[int, int]) -> bool:
        """Mask the committed position after ``run`` (before the end), else the one before it,
        unless the canvas was given it; False when neither can be."""
        i, j = run
        for k in (j, i - 1):
            if 0 <= k < self._end() and self.tokens[k] != self.mask and k not in self.given:
                self.tokens[k] = self.mask
                self.result.reopened += 1
                return True
        return False

    def _write_fills(self, runs: list[tuple[int, int]], spelled: list[tuple[int, ...]], stop: int) -> None:
        """Each run's tokens into its positions; the last run's positions after its tokens, up to
        ``stop``, EOS (only a run before the end can be shorter than its positions)."""
        for (i, _), tokens in zip(runs, spelled):
            self.tokens[i:i + len(tokens)] = tokens
        for k in range(runs[-1][0] + len(spelled[-1]), stop):
            self.tokens[k] = self.eos_id
