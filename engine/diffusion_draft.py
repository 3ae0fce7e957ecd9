"""A masked-diffusion LM as the draft of constrained speculative decoding: ``DiffusionDraft``.

A causal draft model needs one forward pass per drafted token. A masked-diffusion model scores
``context + [MASK] * block`` in one pass and returns a distribution for each of the next
``block`` positions at once; the draft is the most probable *grammar-valid* path through the
first ``k`` of them (the positions scored independently, as the model scores them):

* **regular constraints** whose token DFA is known — the matcher is a ``DFAMatcher``, or
  ``grammar=`` (a ``CompiledGrammar`` with ``is_regular``) was given — ``samplers.dingo_map``:
  the exact argmax over the DFA from the matcher's state (DINGO, Suresh et al. 2025). A
  ``Matcher`` does not expose its DFA state, so it is found by running the DFA over the tokens
  the matcher consumed (the last ``matcher.num_consumed`` tokens of the context: the decoder's
  matcher starts at the grammar's start when generation starts), continuing from the previous
  call's walk when the context extends it. A walk that disagrees with the matcher (a ``grammar=``
  for another constraint, a matcher started mid-text) falls back to the search below.
* **otherwise** (context-free grammars, or no DFA at hand) a beam search over forked matchers:
  each beam's next position is scored by the model's log-probabilities masked with that beam's
  allowed tokens, and the ``beam`` best paths are kept (``beam=1``: greedy).

EOS ends a path; the positions after it count the model's EOS score, as the canvas tail is EOS
padding (what ``engine.tiny_diffusion``'s models learn, and how DINGO models EOS), so paths that
end early compare with longer ones. ``block`` masked positions are appended even when fewer are
drafted: a model trained on EOS-padded canvases reads a short canvas as "the answer ends here".

**Why it stays lossless.** The draft is a deterministic function of the context (one model pass,
then an argmax), so its ``q`` is a point mass on each drafted token, as for ``PromptLookup``; the
acceptance rule of ``engine.speculative`` is exact for it at every temperature. A drafted token
that is the grammar's only choice is marked forced (the target needs no row for it); the decoder
checks that again.

**Fitting the model.** The context is cut from the left so that context + masks fit the model's
positions (``max_positions``; default the config's ``max_position_embeddings``, unbounded for
models without one). Logits rows are fitted to the target vocabulary's width with
``engine.speculative._fit`` (a diffusion model's extra mask column is dropped; columns it lacks
are never drafted), and the mask token and ids past the vocabulary are never drafted.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.diffusion_lm import HFMaskedDiffusionLM, MaskedDiffusionLM, check_canvases
from engine.spec_tree import Draft, _fit, _masked_logits
from grammars import CompiledGrammar, TokenVocabulary
from grammars.masks.token_dfa import DFAMatcher, TokenDFA
from samplers import NoValidBlock, SamplingParams, dingo_map

__all__ = ["DiffusionDraft"]

#: DINGO's end-state budget for a draft: a prefix of the answer, so any live state will do
_UNBOUNDED = 1 << 30


@dataclass
class _Beam:
    score: float
    tokens: list[int]
    matcher: Any
    ended: bool = False


@dataclass
class DiffusionDraft:
    """Drafts ``k`` tokens from one pass of a masked-diffusion model (see the module docstring).

    ``model``: a ``MaskedDiffusionLM`` or a checkpoint folder / hub id (loaded on the CPU with
    ``HFMaskedDiffusionLM.from_pretrained``; ``DiffusionDraft.from_pretrained`` places it).
    ``block``: masked positions appended to the context (at least ``k`` are). ``beam``: beam
    width of the matcher-guided search. ``grammar``: the compiled constraint, so that regular
    ones use DINGO with a plain ``Matcher`` (``with_grammar`` binds it). ``stop_below``: end the
    draft before the first position whose chosen token the model gives less than this
    probability (an unsure token is likely rejected and costs a verified row; the draft stays
    deterministic). Counters: ``calls`` (model passes), ``dingo_drafts`` and ``searched_drafts``
    (drafts per method). Not thread-safe (it keeps the last DFA walk): one per thread.
    """

    model: MaskedDiffusionLM | str | os.PathLike[str]
    block: int = 32
    beam: int = 1
    grammar: CompiledGrammar | None = None
    max_positions: int | None = None
    stop_below: float = 0.0
    calls: int = 0
    dingo_drafts: int = 0
    searched_drafts: int = 0
    _walk: tuple[TokenDFA, list[int], int] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.model, (str, os.PathLike)):
            self.model = _load(self.model)
        if not isinstance(self.model, MaskedDiffusionLM):
            raise TypeError(f"model must be a MaskedDiffusionLM or a checkpoint path, got {type(self.model).__name__}")
        for name in ("block", "beam"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        h = self.stop_below
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0.0 <= h < 1.0:
            raise ValueError(f"stop_below must be a probability in [0, 1), got {h!r}")
        if self.grammar is not None and not isinstance(self.grammar, CompiledGrammar):
            raise TypeError(f"grammar must be a CompiledGrammar, got {type(self.grammar).__name__}")
        if self.max_positions is None:
            self.max_positions = _max_positions(self.model)
        limit = self.max_positions
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 2):
            raise ValueError(f"max_positions must be an int >= 2 (a context token and a mask), got {limit!r}")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], *, device=None, dtype=None, **options: Any) -> DiffusionDraft:
        """Load a masked-diffusion checkpoint onto ``device``/``dtype``; ``options`` are the fields."""
        return cls(_load(path, device=device, dtype=dtype), **options)

    def with_grammar(self, grammar: CompiledGrammar | None) -> DiffusionDraft:
        """The same source (same model) bound to ``grammar``, counters reset."""
        return dataclasses.replace(self, grammar=grammar, calls=0, dingo_drafts=0, searched_drafts=0)

    # --- the DraftSource protocol ----------------------------------------------------------------

    def propose(self, context: list[int], matcher, k: int, params: SamplingParams,
                generator: torch.Generator | None, vocab: TokenVocabulary) -> list[Draft]:
        if k <= 0 or matcher.is_terminated():
            return []
        log_probs = self._log_probs(list(context), k, vocab)
        start = self._dfa_start(context, matcher)
        if start is not None:
            dfa, state = start
            try:
                tokens, _, _ = dingo_map(dfa, log_probs, start_state=state, remaining=_UNBOUNDED)
            except NoValidBlock:  # the model gives every valid path probability zero
                return []
            self.dingo_drafts += 1
        else:
            tokens = self._search(log_probs, matcher, vocab)
            self.searched_drafts += 1
        if self.stop_below:
            unsure = [i for i, t in enumerate(tokens) if t < 0 or float(log_probs[i, t].exp()) < self.stop_below]
            tokens = tokens[:unsure[0]] if unsure else tokens
        return _drafts(tokens, matcher, vocab.eos_token_ids)

    # --- the model pass --------------------------------------------------------------------------

    def _log_probs(self, context: list[int], k: int, vocab: TokenVocabulary) -> torch.Tensor:
        """``[k', width]`` log-probabilities of the next ``k' <= k`` positions (one model pass)."""
        masks = max(self.block, k)
        limit = self.max_positions
        if limit is not None:
            masks = min(masks, limit - 1)
            context = context[-(limit - masks):]
        mask_id = int(self.model.mask_token_id)
        logits = _position_logits(self.model, context + [mask_id] * masks, len(context), len(context) + k)
        self.calls += 1
        width = vocab.logits_width
        rows = torch.stack([_fit(row, width) for row in logits])
        if vocab.size < width:
            rows[:, vocab.size:] = float("-inf")
        if mask_id < width:
            rows[:, mask_id] = float("-inf")
        return torch.log_softmax(rows, dim=-1)

    # --- regular constraints: the DFA state, then DINGO ------------------------------------------

    def _dfa_start(self, context, matcher) -> tuple[TokenDFA, int] | None:
        """The token DFA and the matcher's state in it; None when neither is known."""
        if isinstance(matcher, DFAMatcher):
            return matcher.dfa, matcher.state
        if self.grammar is None or not self.grammar.is_regular:
            return None
        dfa = self.grammar.as_dfa()
        n = matcher.num_consumed
        if n > len(context):
            return None
        state = self._walk_dfa(dfa, [int(t) for t in context[len(context) - n:]])
        if state is None or bool(dfa.accepting[state]) != matcher.is_accepting():
            return None
        return dfa, state

    def _walk_dfa(self, dfa: TokenDFA, consumed: list[int]) -> int | None:
        """The DFA state after ``consumed`` from its start, continuing the last walk when it is a
        prefix (the context grows by the committed tokens between calls); None if the DFA dies."""
        state, done = dfa.start, 0
        if self._walk is not None:
            last_dfa, tokens, last_state = self._walk
            if last_dfa is dfa and len(tokens) <= len(consumed) and consumed[:len(tokens)] == tokens:
                state, done = last_state, len(tokens)
        for token in consumed[done:]:
            state = dfa.next_state(state, token)
            if state < 0:
                return None
        self._walk = (dfa, consumed, state)
        return state

    # --- any constraint: beam search over forked matchers ----------------------------------------

    def _search(self, log_probs: torch.Tensor, matcher, vocab: TokenVocabulary) -> list[int]:
        width = vocab.logits_width
        eos = sorted(t for t in vocab.eos_token_ids if 0 <= t < width)
        eos_score = log_probs[:, eos].max(dim=-1).values.tolist() if eos else [float("-inf")] * len(log_probs)
        beams = [_Beam(0.0, [], matcher)]
        for i, row in enumerate(log_probs):
            if all(b.ended for b in beams):
                break  # every later position adds the same EOS score to each: the order stays
            candidates: list[tuple[float, int, int]] = []  # (score, beam, token; -1: ended beam)
            for b, beam in enumerate(beams):
                if beam.ended:
                    candidates.append((beam.score + eos_score[i], b, -1))
                    continue
                masked = _masked_logits(row, beam.matcher, width)
                top = torch.topk(masked, min(self.beam, width))
                for value, token in zip(top.values.tolist(), top.indices.tolist()):
                    if value != float("-inf"):
                        candidates.append((beam.score + value, b, token))
            if not candidates:
                break
            candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
            kept = []
            for score, b, token in candidates[:self.beam]:
                parent = beams[b]
                if token < 0:
                    kept.append(_Beam(score, parent.tokens, parent.matcher, True))
                    continue
                child = parent.matcher.fork()
                child.advance(token)
                kept.append(_Beam(score, parent.tokens + [token], child, token in vocab.eos_token_ids))
            beams = kept
        return max(beams, key=lambda b: b.score).tokens  # the first on ties: the best-ranked


def _drafts(tokens: list[int], matcher, eos: frozenset[int]) -> list[Draft]:
    """Point-mass drafts along ``tokens`` (up to EOS), the grammar's only choices marked forced."""
    fork = matcher.fork()
    out: list[Draft] = []
    for token in tokens:
        token = int(token)
        if token < 0 or not fork.allows(token):
            break  # never for DINGO's or the search's paths; kept so the contract holds regardless
        out.append(Draft(token, None, forced=fork.forced_tokens(1) == [token]))
        fork.advance(token)
        if token in eos:
            break
    return out


def _position_logits(lm: MaskedDiffusionLM, canvas: list[int], start: int, stop: int) -> torch.Tensor:
    """Logits ``[stop - start, lm.logits_width]`` of canvas positions ``start .. stop - 1``.

    A transformers model's output layer runs on those positions only (a forward pre-hook cuts its
    input): over a prompt of hundreds of tokens, a vocabulary-wide output layer at every position
    costs more than the rest of a small model's pass, and the draft reads ``k`` rows. Other models
    (and Dream-style shifted logits) score the whole canvas through ``canvas_logits``.
    """
    head = _output_layer(lm)
    if head is None:
        return lm.canvas_logits([canvas])[0, start:stop]
    ids = torch.tensor(check_canvases([canvas], lm.logits_width), dtype=torch.long, device=lm.device)

    def keep(module, args):
        return (args[0][..., start:stop, :], *args[1:])

    handle = head.register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            out = lm.model(input_ids=ids)
    finally:
        handle.remove()
    logits = out.logits if hasattr(out, "logits") else out[0]
    lm.forward_calls += 1
    lm.tokens_fed += ids.numel()
    if tuple(logits.shape) != (1, stop - start, lm.logits_width):
        raise RuntimeError(f"{type(lm.model).__name__} returned logits of shape {tuple(logits.shape)} with its output "
                           f"layer cut to {stop - start} positions; expected [1, {stop - start}, {lm.logits_width}]")
    return logits[0].float()


def _output_layer(lm: Any) -> torch.nn.Module | None:
    """The output layer of an unshifted ``HFMaskedDiffusionLM`` (None for any other model)."""
    if not isinstance(lm, HFMaskedDiffusionLM) or lm.shift_logits:
        return None
    get = getattr(lm.model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, torch.nn.Module) else None


def _load(path: str | os.PathLike[str], *, device=None, dtype=None) -> MaskedDiffusionLM:
    local = os.path.exists(os.path.expanduser(str(path)))
    source = os.path.expanduser(str(path)) if local else str(path)
    return HFMaskedDiffusionLM.from_pretrained(source, device=device, dtype=dtype, local_files_only=local)


def _max_positions(lm: Any) -> int | None:
    """The model's position limit: a ``max_positions`` attribute, else its transformers config's
    ``max_position_embeddings``; None when it has neither (no limit is applied)."""
    value = getattr(lm, "max_positions", None)
    if value is None:
        config = getattr(getattr(lm, "model", None), "config", None)
        value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 1 else None
