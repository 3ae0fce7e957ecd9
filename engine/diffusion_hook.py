"""A corral constraint inside DiffusionGemma's own ``generate`` (transformers 5.x), through its
``logits_processor`` hook.

**What the hook sees.** ``DiffusionGemmaForBlockDiffusion.generate`` writes the output in
canvases (blocks of ``config.canvas_length`` tokens), each denoised in up to
``max_denoising_steps`` steps. Every step it calls the processors with ``input_ids`` — the prompt
and the canvases already finished, *not* the canvas being denoised — ``scores`` of shape
``[batch, canvas_length, vocab]`` for every position of the canvas, and ``cur_step`` (steps left).
There is no mask token: the canvas starts as uniform random tokens, the entropy-bound sampler
keeps the low-entropy positions of a draw from the processed scores and re-noises the rest, and
what the canvas *emits* is the per-position argmax of the processed scores of its last step
(``argmax_canvas``), appended to ``input_ids``. Which step is the last is the model's decision
(the stable-and-confident stopping rule, or ``max_denoising_steps``).

**How the hook makes that exact.** Every step, for every unfinished row, the processor chooses
one whole valid canvas ``c`` from the step's scores and returns a point mass on it (``-inf``
everywhere except ``c[i]`` at position ``i``). Whatever step turns out to be the last, its argmax
is ``c``; the sampler draws ``c`` too (zero entropy: every position is accepted), temperature
scaling and self-conditioning (a softmax) keep it, and the stopping rule stops once ``c`` is
stable. The model still decides the text: ``c`` is chosen from its scores, which depend on the
noisy canvas and its own previous step.

* regular constraints (``CompiledGrammar.is_regular``: regexes, JSON Schemas whose language is
  regular): ``c`` is the canvas's most probable valid assignment under the per-position scores,
  ``samplers.dingo_map`` (``temperature > 0``: an exact draw, ``samplers.dingo_sample``);
* context-free grammars: left to right, each position the best token (or a draw) among those the
  matcher allows, narrowed by budget-aware closing (``engine.closing.BudgetClosing``) so that a
  completion always fits in the positions left.

Tokens after an EOS are EOS; the text is everything before the first EOS (``generate`` also
replaces them with ``pad_token_id`` once a row finishes). A canvas must end where the text is
complete, unless ``max_new_tokens`` says more canvases follow: pass the same value (or a smaller
one) as to ``generate``. The default (``None``) closes every canvas, which is valid whatever
``generate`` is told. Before a canvas is emitted it is replayed on a copy of the row's matcher:
if it is not valid the processor raises instead (fail closed).

Usage (``generate`` needs a ``LogitsProcessorList``, not a plain list — it appends its temperature
schedule to it, so build a new list for each call)::

    processor = CorralCanvasProcessor(compiled)
    out = model.generate(ids, logits_processor=LogitsProcessorList([processor]),
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)

Pass ``eos_token_id`` the grammar vocabulary's EOS, so that ``generate`` stops where the text ends
(an id ``generate`` takes for EOS that the grammar reads as text would cut the text short). Put
this processor last among yours: a processor after it that turns ``-inf`` back into a number could
change the argmax (the processor notices at the next canvas and raises). ``generate``'s settings
are out of the hook's sight: ``check_settings(model, ids, **generate_kwargs)`` checks them first.
Errors: ``CanvasHookError`` (its ``setting`` names what to change). Not thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from engine.closing import BudgetClosing, ClosingPlanner
from grammars import CompiledGrammar
from grammars.errors import ConstraintError, NoAllowedToken, TokenRejected
from samplers import NoValidBlock, dingo_map, dingo_sample
from samplers.base import SamplingParams
from samplers.masked import masked_draw

__all__ = ["CanvasHookError", "CorralCanvasProcessor"]


class CanvasHookError(ConstraintError, RuntimeError):
    """The hook cannot guarantee a valid canvas under this setting; ``setting`` names it."""

    def __init__(self, setting: str, message: str):
        self.setting = setting
        super().__init__(f"{setting}: {message}")


@dataclass
class _Row:
    """One batch row: its grammar and, for the canvas being denoised, where the text stands."""

    grammar: CompiledGrammar
    matcher: object  # the grammar's matcher after the text emitted so far
    dfa_state: int | None = None  # the token DFA's state after it (DINGO rows only)
    finished: bool = False
    #: the canvases chosen at this canvas's steps, each up to its first EOS: generate emits one of
    #: them (the last step's, or an earlier one's for a row its stopping rule froze before the others)
    chosen: set[tuple[int, ...]] = field(default_factory=set)


class CorralCanvasProcessor(LogitsProcessor):
    """Keeps DiffusionGemma's emitted canvases valid under compiled grammars (module docstring).

    ``grammar``: one ``CompiledGrammar``, or one per batch row. ``max_new_tokens``: the budget
    ``generate`` is given, when the text may span several canvases (``None``: every canvas closes
    the text). ``temperature``: 0 picks the best valid canvas; above 0 draws one with
    ``generator``. ``mode``: ``"auto"`` (DINGO for regular constraints, left to right otherwise),
    ``"dingo"`` or ``"left_to_right"``.
    """

    def __init__(self, grammar: CompiledGrammar | Sequence[CompiledGrammar], *, max_new_tokens: int | None = None,
                 temperature: float = 0.0, generator: torch.Generator | None = None, mode: str = "auto"):
        grammars = [grammar] if isinstance(grammar, CompiledGrammar) else list(grammar)
        if not grammars or not all(isinstance(g, CompiledGrammar) for g in grammars):
            raise TypeError("CorralCanvasProcessor needs a CompiledGrammar or a non-empty list of them")
        if len({(g.vocab.logits_width, g.vocab.eos_token_ids) for g in grammars}) != 1:
            raise ValueError("all grammars must be compiled for one vocabulary (logits width and EOS ids differ)")
        if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                                           or max_new_tokens < 1):
            raise ValueError(f"max_new_tokens must be None or an int >= 1, got {max_new_tokens!r}")
        if mode not in ("auto", "dingo", "left_to_right"):
            raise ValueError(f"mode must be 'auto', 'dingo' or 'left_to_right', got {mode!r}")
        if mode == "dingo" and not all(g.is_regular for g in grammars):
            raise ValueError("mode='dingo' needs regular constraints; use 'left_to_right' for context-free grammars")
        self.params = SamplingParams(temperature=temperature)  # validates the temperature
        self._grammars = grammars
        self.vocab = grammars[0].vocab
        self._eos = frozenset(self.vocab.eos_token_ids)
        self._planner = ClosingPlanner(self.vocab)
        self.max_new_tokens = max_new_tokens
        self.generator = generator
        self.mode = mode
        self.reset()

    def reset(self) -> None:
        """Forget the prompt and the canvases so far; the next call starts a new ``generate``."""
        self._seen: torch.Tensor | None = None  # input_ids of the latest call
        self._prompt_width = 0
        self._rows: list[_Row] = []

    def check_settings(self, model, input_ids: torch.Tensor, **generate_kwargs) -> None:
        """Raise ``CanvasHookError`` naming a ``generate`` setting under which the emitted text
        could be invalid; the hook itself cannot see them. Call with what ``generate`` gets.

        * ``eos_token_id``: ``generate`` ends a row and pads it after any id it is told is EOS;
          one the grammar reads as text would cut the text short.
        * ``max_new_tokens``: fewer canvases than this processor's ``max_new_tokens`` plans for
          would stop the text before it closes.
        * ``logits_processor``: a ``LogitsProcessorList`` with this processor last.
        """
        config, _ = model._prepare_generation_config(generate_kwargs.get("generation_config"), **{
            k: v for k, v in generate_kwargs.items() if k not in ("generation_config", "logits_processor")})
        eos = config.eos_token_id
        eos = [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
        foreign = sorted(set(eos) - self._eos)
        if foreign:
            raise CanvasHookError("eos_token_id", f"generate ends rows at {foreign}, which the grammar's vocabulary "
                                  f"does not treat as EOS (its EOS ids: {sorted(self._eos)})")
        if self.max_new_tokens is not None:
            _, budget = model._prepare_generated_length(config, input_ids.shape[1])
            length = model.config.canvas_length
            if math.ceil(budget / length) < math.ceil(self.max_new_tokens / length):
                raise CanvasHookError("max_new_tokens", f"generate writes {math.ceil(budget / length)} canvases, "
                                      f"the processor plans for {math.ceil(self.max_new_tokens / length)}")
        processors = generate_kwargs.get("logits_processor")
        if not (isinstance(processors, LogitsProcessorList) and len(processors) and processors[-1] is self):
            raise CanvasHookError("logits_processor", "pass a LogitsProcessorList whose last entry is this processor")

    # --- the hook ------------------------------------------------------------------------------

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor,
                 cur_step: torch.Tensor) -> torch.FloatTensor:
        """Point masses on one valid canvas per unfinished row; finished rows pass unchanged.

        ``cur_step`` is unused, but named: ``LogitsProcessorList`` passes it only to processors
        whose signature asks for it by name."""
        if scores.dim() != 3:
            raise CanvasHookError("logits_processor", "expected DiffusionGemma's canvas scores [batch, canvas, "
                                  f"vocab], got shape {tuple(scores.shape)}; for autoregressive generate use "
                                  "CorralLogitsProcessor")
        _, length, width = scores.shape
        if width < self.vocab.logits_width:
            raise ValueError(f"scores have {width} columns, fewer than the grammar vocabulary's "
                             f"logits width {self.vocab.logits_width}")
        self._sync(input_ids, length)
        out = torch.full_like(scores, float("-inf"))
        for b, row in enumerate(self._rows):
            if row.finished:
                out[b] = scores[b]  # generate pads this row; keep its softmax finite
                continue
            logits = scores[b, :, : self.vocab.logits_width].detach().float().cpu()
            if self.vocab.size < self.vocab.logits_width:
                logits[:, self.vocab.size:] = float("-inf")
            canvas = self._choose(row, logits, self._remaining(input_ids.shape[1], length))
            row.chosen.add(self._key(canvas))
            out[b, torch.arange(length, device=scores.device), torch.tensor(canvas, device=scores.device)] = 0.0
        return out

    # --- which canvas we are in ---------------------------------------------------------------

    def _sync(self, input_ids: torch.Tensor, length: int) -> None:
        """Start over on a new prompt; on the next canvas, check it is the one we chose and advance."""
        ids = input_ids.detach().cpu()
        seen = self._seen
        same_batch = seen is not None and seen.shape[0] == ids.shape[0]
        if same_batch and ids.shape[1] == seen.shape[1] and torch.equal(ids, seen):
            return  # another step of the same canvas
        if same_batch and ids.shape[1] == seen.shape[1] + length and torch.equal(ids[:, : seen.shape[1]], seen):
            tails = ids[:, seen.shape[1]:].tolist()
            running = [(row, tokens) for row, tokens in zip(self._rows, tails) if not row.finished]
            for row, tokens in running:  # all checked before any row moves
                self._check_emitted(row, tokens)
            for row, tokens in running:
                self._advance(row, tokens)
                row.chosen.clear()
            self._seen = ids
            return
        self._start(ids)

    def _start(self, ids: torch.Tensor) -> None:
        batch = ids.shape[0]
        if len(self._grammars) not in (1, batch):
            raise ValueError(f"{len(self._grammars)} grammars for a batch of {batch} rows; pass one or one per row")
        grammars = self._grammars * batch if len(self._grammars) == 1 else self._grammars
        self._seen = ids
        self._prompt_width = ids.shape[1]
        self._rows = []
        for grammar in grammars:
            dingo = self.mode == "dingo" or (self.mode == "auto" and grammar.is_regular)
            self._rows.append(_Row(grammar, grammar.matcher(), grammar.as_dfa().start if dingo else None))

    def _key(self, tokens: list[int]) -> tuple[int, ...]:
        """``tokens`` up to and including the first EOS (``generate`` may pad what follows)."""
        end = next((i + 1 for i, t in enumerate(tokens) if t in self._eos), len(tokens))
        return tuple(tokens[:end])

    def _check_emitted(self, row: _Row, tokens: list[int]) -> None:
        """``generate`` appended ``tokens``: they must be a canvas we chose (and so checked)."""
        if self._key(tokens) not in row.chosen:
            raise CanvasHookError("logits_processor", "generate emitted a canvas this processor did not choose: "
                                  "a processor after it changed the scores (put this one last), or this is a new "
                                  "generate call (call reset() between calls)")

    def _advance(self, row: _Row, tokens: list[int]) -> None:
        end = next((i for i, t in enumerate(tokens) if t in self._eos), None)
        text = tokens if end is None else tokens[:end]
        for token in text:
            row.matcher.advance(token)
        if row.dfa_state is not None:
            dfa = row.grammar.as_dfa()
            for token in text:
                row.dfa_state = dfa.next_state(row.dfa_state, token)
        row.finished = end is not None

    def _remaining(self, seq_len: int, length: int) -> int:
        """Positions after this canvas that the text may still use (0: it must close here)."""
        if self.max_new_tokens is None:
            return 0
        total = math.ceil(self.max_new_tokens / length) * length
        return max(0, total - (seq_len - self._prompt_width) - length)

    # --- one canvas ------------------------------------------------------------------------------

    def _choose(self, row: _Row, logits: torch.Tensor, remaining: int) -> list[int]:
        if row.dfa_state is not None:
            canvas = self._dingo(row, logits, remaining)
        else:
            canvas = self._left_to_right(row, logits, remaining)
        self._verify(row, canvas, remaining)
        return canvas

    def _dingo(self, row: _Row, logits: torch.Tensor, remaining: int) -> list[int]:
        dfa = row.grammar.as_dfa()
        try:
            if self.params.temperature == 0:
                tokens, _, _ = dingo_map(dfa, logits, start_state=row.dfa_state, remaining=remaining)
            else:
                tokens, _, _ = dingo_sample(dfa, logits, start_state=row.dfa_state, remaining=remaining,
                                            temperature=self.params.temperature, generator=self.generator)
        except NoValidBlock as err:
            raise CanvasHookError("max_new_tokens", f"no valid canvas of {logits.shape[0]} positions with "
                                  f"{remaining} after it: {err}") from err
        return [int(t) for t in tokens]

    def _left_to_right(self, row: _Row, logits: torch.Tensor, remaining: int) -> list[int]:
        matcher = row.matcher.fork()
        length = logits.shape[0]
        closing = BudgetClosing(self._planner, matcher.num_consumed + length + remaining + 1)
        if not self._planner.fits(matcher, length + remaining + 1):
            raise CanvasHookError("max_new_tokens", f"no completion of the text fits in the {length + remaining} "
                                  "positions left (raise max_new_tokens or the model's canvas_length)")
        canvas: list[int] = []
        for i in range(length):
            if matcher.is_terminated():
                canvas.append(canvas[-1])  # after EOS: EOS
                continue
            try:
                token = masked_draw(logits[i], closing.narrow(matcher), self.params, self.generator)
            except NoAllowedToken:  # the model gives every admitted token zero probability: any admitted one
                token = masked_draw(torch.zeros_like(logits[i]), closing.narrow(matcher), self.params, self.generator)
            matcher.advance(token)
            canvas.append(token)
        return canvas

    def _verify(self, row: _Row, canvas: list[int], remaining: int) -> None:
        """Replay ``canvas`` on a fork of the row's matcher: never emit an invalid one."""
        matcher = row.matcher.fork()
        end = next((i for i, t in enumerate(canvas) if t in self._eos), None)
        try:
            for token in canvas if end is None else canvas[: end + 1]:
                matcher.advance(token)
        except TokenRejected as err:
            raise CanvasHookError("mode", f"the chosen canvas is not valid: {err}") from err
        if end is not None:
            if any(t not in self._eos for t in canvas[end:]):
                raise CanvasHookError("mode", "the chosen canvas has text after an EOS")
            return
        if row.dfa_state is not None:  # the exact fewest tokens DINGO's budget used
            dfa = row.grammar.as_dfa()
            state = row.dfa_state
            for token in canvas:
                state = dfa.next_state(state, token)
            closing = dfa.shortest_completion(state)
            fits = closing is not None and len(closing) <= remaining
        else:  # closing's bound: the same the left-to-right choice kept
            fits = bool(self._planner.fits(matcher, remaining + 1))
        if not fits:
            raise CanvasHookError("max_new_tokens", "the chosen canvas leaves a text that cannot be completed in "
                                  f"the {remaining} positions after it")
