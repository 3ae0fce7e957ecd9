"""Speculative decoding under a constraint, lossless: a cheap draft proposes, the target verifies.

One sequence at a time. Each round:

1. **Draft.** The grammar's forced run (``matcher.forced_tokens()``, each the only allowed token)
   is drafted first, for free; then the draft source proposes up to ``k`` more tokens:

   * ``DraftModel(lm)`` — a smaller causal ``LanguageModel`` sharing the target's tokenizer; each
     token is drawn from the draft model's *masked* distribution (mask, then ``process_logits``
     with the same ``SamplingParams``) on a forked matcher. ``constrained=False`` draws from the
     unmasked distribution instead and trims the draft at its first invalid token; the ``q`` it
     is verified with is then that distribution conditioned on validity (renormalised over the
     allowed tokens), which is the law of a draft token that survives the check, so the rule
     below stays exact.
   * ``PromptLookup(ngram=3)`` — n-gram copy from prompt + output (transformers'
     ``prompt_lookup_num_tokens``): a deterministic proposal, ``q`` a point mass.
   * ``ForcedTokens()`` — nothing beyond the forced run.

   Every draft token is checked on a forked matcher before the target sees it; a draft is
   trimmed at its first invalid token and ends after EOS.
2. **Verify.** The target scores every prefix ``context + draft[:i]`` (``i = 0..n``) in one
   ``LanguageModel.next_logits`` call (``HFCausalLM`` shares its KV cache across the rows' common
   prefix). At each position the target's *constrained* distribution ``p`` is the mask of the
   state reached along the draft applied to its logits, then ``process_logits``; ``q`` is the
   draft's distribution, computed the same way. Draft token ``x`` is accepted with probability
   ``min(1, p(x)/q(x))``; at the first rejection the token is drawn from
   ``normalize(max(0, p − q))``; when all are accepted a bonus token is drawn from ``p`` at the
   state after the draft. Greedy (``temperature=0``): a draft token is accepted while it equals
   the target's constrained argmax (the argmax ``engine.decoding`` takes: the masked logits, first
   index on ties), and the argmax is emitted at the first mismatch.
3. **Commit.** Only accepted tokens (and the corrected or bonus one) advance the real matcher;
   drafting and verification walk forks, so nothing needs rolling back.

Why it is lossless: at every position, conditioned on the tokens before it, the emitted token is
distributed as ``p`` whatever the draft did (Leviathan et al. 2023; Chen et al. 2023), so the
sequence distribution is exactly token-by-token masked sampling from the target — what
``engine.decode`` with the masked sampler draws (not the same random stream, the same law).
Forced drafts are the only allowed token, so ``p`` is a point mass on them and they are always
accepted (without reading the logits). EOS is allowed only at accepting states, as in
``engine.decoding``; a state where the mask holds only EOS ends the sequence without a model call.
``max_tokens`` counts EOS as in ``engine.decoding``: a round drafts at most ``remaining − 1``
tokens so that its last token still fits.

Which samplers compose: only locally normalised ones — the masked sampler (``MaskedSampler``,
any temperature/top-k/top-p). The acceptance rule reproduces a *per-token* distribution ``p``
conditioned on the prefix. ASAp, AWRS and SMC target the model conditioned on the whole grammar:
ASAp reweights each step by learnt estimates of future validity and carries state across
sequences, AWRS and SMC attach importance weights to sequences (and SMC resamples particles), so
their draws are not a fixed per-step distribution the rule could match; composing them would need
the weights carried through acceptance, which this module does not do. ``generate`` refuses them
with ``draft_model=``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from engine.decoding import FinishReason
from engine.lm import HFCausalLM, LanguageModel
from grammars import TokenVocabulary, allocate_token_bitmask
from grammars.bitmask import unpack_bits
from samplers import (
    NoAllowedToken,
    SamplingParams,
    apply_token_bitmask_inplace,
    sample_categorical,
)
from samplers._numeric import uniforms
from samplers.base import process_logits

__all__ = [
    "Draft",
    "DraftSource",
    "DraftModel",
    "PromptLookup",
    "ForcedTokens",
    "SpeculativeOutput",
    "speculative_decode",
    "resolve_draft",
]

#: the longest forced run drafted in one round (beyond ``k``)
_MAX_FORCED = 64
#: the default sampling parameters (plain softmax at temperature 1)
_DEFAULT_PARAMS = SamplingParams()


@dataclass(frozen=True)
class Draft:
    """One drafted token and the distribution it was drawn from (``q``: probabilities over the
    logits width; ``None``: a deterministic proposal, a point mass on ``token``). ``forced``: the
    grammar's only allowed token (accepted without verification)."""

    token: int
    q: torch.Tensor | None = None
    forced: bool = False


@runtime_checkable
class DraftSource(Protocol):
    """Proposes up to ``k`` tokens after ``context`` (prompt + generated + drafts so far).

    ``matcher`` is a fork at the state after ``context`` that the source may advance freely. The
    caller checks every token again and trims at the first invalid one.
    """

    def propose(self, context: list[int], matcher, k: int, params: SamplingParams,
                generator: torch.Generator | None, vocab: TokenVocabulary) -> list[Draft]:
        ...


def _fit(logits: torch.Tensor, width: int) -> torch.Tensor:
    """A 1-D float row of exactly ``width`` columns (a draft model's output layer may differ in
    padding: extra columns are padding, missing ones are never allowed)."""
    row = logits.detach().float().reshape(-1)
    if row.shape[0] == width:
        return row.clone()
    if row.shape[0] > width:
        return row[:width].clone()
    pad = torch.full((width - row.shape[0],), float("-inf"), dtype=row.dtype, device=row.device)
    return torch.cat([row, pad])


def _masked_logits(logits: torch.Tensor, matcher, width: int) -> torch.Tensor:
    words = allocate_token_bitmask(1, width)
    matcher.fill_mask(words, 0)
    masked = _fit(logits, width)
    apply_token_bitmask_inplace(masked, words[0])
    return masked


def _distribution(masked: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float64 probabilities from masked logits (``NoAllowedToken`` when everything is ``-inf``)."""
    if torch.isneginf(masked).all():
        raise NoAllowedToken("every token is masked out in this state")
    return torch.softmax(process_logits(masked, params).double(), dim=-1).cpu()


def _greedy(masked: torch.Tensor) -> int:
    best = int(torch.argmax(masked))
    if masked[best] == float("-inf"):
        raise NoAllowedToken("every token is masked out in this state")
    return best


@dataclass
class DraftModel:
    """A smaller causal ``LanguageModel`` (same tokenizer) drafting under the same constraint.

    ``constrained=False`` drafts from the unmasked distribution and lets the check trim the draft
    at its first invalid token (its ``q`` is then conditioned on validity; see the module
    docstring). ``calls`` counts the draft model's ``next_logits`` calls.
    """

    lm: LanguageModel
    constrained: bool = True
    calls: int = 0

    def propose(self, context, matcher, k, params, generator, vocab):
        width, eos = vocab.logits_width, vocab.eos_token_ids
        drafts: list[Draft] = []
        ctx = list(context)
        while len(drafts) < k and not matcher.is_terminated():
            forced = matcher.forced_tokens(1)
            if forced:  # the only allowed token: no draft call needed
                drafts.append(Draft(forced[0], None, forced=True))
                matcher.advance(forced[0])
                ctx.append(forced[0])
                continue
            logits = _fit(self.lm.next_logits([ctx])[0], width)
            self.calls += 1
            try:
                draft = self._draw(logits, matcher, width, params, generator)
            except NoAllowedToken:
                break
            drafts.append(draft)
            if not matcher.allows(draft.token):
                break  # an invalid draft token (constrained=False): the caller's check trims it
            matcher.advance(draft.token)
            ctx.append(draft.token)
            if draft.token in eos:
                break
        return drafts

    def _draw(self, logits, matcher, width, params, generator) -> Draft:
        if self.constrained:
            masked = _masked_logits(logits, matcher, width)
            if params.temperature == 0:
                return Draft(_greedy(masked))
            q = _distribution(masked, params)
            return Draft(sample_categorical(q, generator), q)
        if params.temperature == 0:
            return Draft(int(torch.argmax(logits)))
        q = torch.softmax(process_logits(logits, params).double(), dim=-1).cpu()
        token = sample_categorical(q, generator)
        if not matcher.allows(token):
            return Draft(token)  # invalid: trimmed before verification
        words = allocate_token_bitmask(1, width)
        matcher.fill_mask(words, 0)
        valid = q * torch.from_numpy(unpack_bits(words[0], width)).to(q.dtype)
        return Draft(token, valid / valid.sum())  # the law of a draft token that passes the check


@dataclass
class PromptLookup:
    """n-gram copy from prompt + output (transformers' prompt lookup decoding): find the last
    ``n`` tokens (``n = ngram .. 1``) earlier in the context and propose what followed them.
    Deterministic, so ``q`` is a point mass."""

    ngram: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.ngram, bool) or not isinstance(self.ngram, int) or self.ngram < 1:
            raise ValueError(f"ngram must be a positive int, got {self.ngram!r}")

    def propose(self, context, matcher, k, params, generator, vocab):
        if k <= 0:
            return []
        tokens = list(context)
        for n in range(min(self.ngram, len(tokens) - 1), 0, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):  # the most recent earlier match first
                if tokens[start:start + n] == suffix:
                    follow = tokens[start + n:start + n + k]
                    if follow:
                        return [Draft(t) for t in follow]
        return []


@dataclass
class ForcedTokens:
    """Drafts the grammar's forced run only (which every source drafts first anyway)."""

    def propose(self, context, matcher, k, params, generator, vocab):
        return []


@dataclass
class SpeculativeOutput:
    """One sequence: generated tokens (EOS excluded), bytes, how it ended, and the counters.

    ``target_calls``: target ``next_logits`` calls; ``drafted``: draft tokens that reached
    verification (after trimming; forced ones included), ``trimmed``: proposed tokens the grammar
    refused (at most one per round, the draft is cut there), ``accepted``: drafts accepted,
    ``forced_tokens``: forced drafts accepted; ``accepted_per_call``: tokens committed by each target call (accepted drafts
    plus the corrected or bonus token). ``per_token_s``: seconds per round.
    """

    token_ids: list[int]
    text: bytes
    finish_reason: FinishReason
    target_calls: int = 0
    drafted: int = 0
    trimmed: int = 0
    accepted: int = 0
    forced_tokens: int = 0
    accepted_per_call: list[int] = field(default_factory=list)
    first_token_s: float | None = None
    per_token_s: list[float] = field(default_factory=list)

    @property
    def tokens_per_call(self) -> float:
        """Mean tokens committed per target call (1.0 is plain decoding)."""
        return sum(self.accepted_per_call) / len(self.accepted_per_call) if self.accepted_per_call else 0.0


def speculative_decode(
    target_lm: LanguageModel,
    draft: DraftSource,
    vocab: TokenVocabulary,
    prompt_ids: Sequence[int],
    matcher,
    *,
    k: int = 4,
    max_tokens: int = 256,
    params: SamplingParams = _DEFAULT_PARAMS,
    generator: torch.Generator | None = None,
) -> SpeculativeOutput:
    """Generate one sequence from ``matcher``'s state (advanced in place) with ``draft`` proposing
    up to ``k`` tokens per target call; the output's law is masked sampling from ``target_lm``.

    Raises ``ValueError`` for bad arguments and ``NoAllowedToken`` where the grammar allows nothing.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k (num_speculative_tokens) must be an int >= 0, got {k!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
    if not callable(getattr(draft, "propose", None)):
        raise TypeError(f"draft must be a DraftModel, PromptLookup or ForcedTokens, got {type(draft).__name__}")
    width = vocab.logits_width
    if target_lm.logits_width != width:
        raise ValueError(f"vocabulary logits_width {width} != model logits_width {target_lm.logits_width}")
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("prompt_ids is empty; start it with a BOS (or EOS) token id")
    eos = frozenset(vocab.eos_token_ids)
    text_only = torch.ones(width, dtype=torch.bool)
    text_only[sorted(eos)] = False
    out = SpeculativeOutput([], b"", "length")
    started = last = time.perf_counter()
    text = bytearray()
    while not matcher.is_terminated():
        remaining = max_tokens - len(out.token_ids)
        if remaining <= 0:
            break
        words = allocate_token_bitmask(1, width)
        matcher.fill_mask(words, 0)
        allowed = torch.from_numpy(unpack_bits(words[0], width))
        if not bool((allowed & text_only).any()):
            if not bool(allowed.any()):
                raise NoAllowedToken(f"the grammar allows no token after {len(out.token_ids)} generated tokens")
            matcher.advance(min(t for t in eos if allowed[t]))  # only EOS: the grammar ends here
            out.finish_reason = "stop"
            break
        context = prompt + out.token_ids
        drafts, trimmed = _draft(draft, context, matcher, min(k, remaining - 1), remaining - 1, params, generator, vocab)
        out.trimmed += trimmed
        committed = _verify(target_lm, context, matcher, drafts, width, params, generator, out)
        out.target_calls += 1
        out.drafted += len(drafts)
        out.accepted_per_call.append(len(committed))
        now = time.perf_counter()
        if out.first_token_s is None:
            out.first_token_s = now - started
        out.per_token_s.append(now - last)
        last = now
        for token in committed:
            matcher.advance(token)
            if token in eos:
                out.finish_reason = "stop"
                break
            out.token_ids.append(token)
            text += vocab.token_bytes[token] if token < vocab.size else b""
    out.text = bytes(text)
    return out


def _draft(source, context, matcher, k, room, params, generator, vocab) -> tuple[list[Draft], int]:
    """The forced run (free, within ``room``) then up to ``k`` source tokens, checked on a fork;
    and whether the source's draft was trimmed (1) or not (0)."""
    fork = matcher.fork()
    drafts = [Draft(t, None, forced=True) for t in fork.forced_tokens(min(room, _MAX_FORCED))]
    for d in drafts:
        fork.advance(d.token)
    k = min(k, room - len(drafts))
    trimmed = 0
    if k > 0 and not fork.is_terminated():
        proposed = source.propose(context + [d.token for d in drafts], fork.fork(), k, params, generator, vocab)
        for d in list(proposed)[:k]:
            token = int(d.token)
            if not fork.allows(token):
                trimmed = 1  # trimmed at the first invalid token
                break
            forced = bool(d.forced) and fork.forced_tokens(1) == [token]  # trusted only when it is
            fork.advance(token)
            drafts.append(Draft(token, d.q, forced))
            if token in vocab.eos_token_ids:
                break
    return drafts, trimmed


def _verify(target_lm, context, matcher, drafts, width, params, generator, out) -> list[int]:
    """The tokens this round commits: accepted drafts, then the corrected or bonus token."""
    prefixes = [context + [d.token for d in drafts[:i]] for i in range(len(drafts) + 1)]
    logits = target_lm.next_logits(prefixes)
    state = matcher.fork()
    committed: list[int] = []
    greedy = params.temperature == 0
    for i, d in enumerate(drafts):
        if d.forced:
            out.accepted += 1
            out.forced_tokens += 1
            committed.append(d.token)
            state.advance(d.token)
            continue
        masked = _masked_logits(logits[i], state, width)
        if greedy:
            best = _greedy(masked)
            if d.token != best:
                committed.append(best)
                return committed
        else:
            p = _distribution(masked, params)
            px = float(p[d.token])
            qx = 1.0 if d.q is None else float(d.q[d.token])
            ratio = px / qx if qx > 0 else 0.0
            if ratio < 1.0 and not float(uniforms(1, generator)[0]) < ratio:
                committed.append(_residual(p, d, generator))
                return committed
        out.accepted += 1
        committed.append(d.token)
        state.advance(d.token)
        if state.is_terminated():  # EOS accepted: no bonus
            return committed
    masked = _masked_logits(logits[len(drafts)], state, width)
    committed.append(_greedy(masked) if greedy else sample_categorical(_distribution(masked, params), generator))
    return committed


def _residual(p: torch.Tensor, d: Draft, generator) -> int:
    """A token from ``normalize(max(0, p − q))`` (``q`` a point mass when ``d.q`` is None)."""
    if d.q is None:
        residual = p.clone()
        residual[d.token] = 0.0
    else:
        residual = torch.clamp(p - d.q.to(p.dtype), min=0.0)
    if not float(residual.sum()) > 0.0:  # p == q up to rounding: the rejection was a rounding artefact
        residual = p
    return sample_categorical(residual, generator)


def resolve_draft(spec: Any, *, device=None, dtype=None) -> DraftSource:
    """A draft source from ``generate``'s ``draft_model=``: ``"prompt_lookup"``, ``"forced"``, a
    source instance, a ``LanguageModel``, a transformers causal LM or a path / hub id."""
    if isinstance(spec, str) and spec in ("prompt_lookup", "forced"):
        return PromptLookup() if spec == "prompt_lookup" else ForcedTokens()
    if isinstance(spec, (DraftModel, PromptLookup, ForcedTokens)):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        local = os.path.exists(os.path.expanduser(str(spec)))
        source = os.path.expanduser(str(spec)) if local else str(spec)
        return DraftModel(HFCausalLM.from_pretrained(source, device=device, dtype=dtype, local_files_only=local))
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        PreTrainedModel = ()
    if PreTrainedModel and isinstance(spec, PreTrainedModel):
        return DraftModel(HFCausalLM(spec, device=device, dtype=dtype))
    if isinstance(spec, LanguageModel):
        return DraftModel(spec)
    if callable(getattr(spec, "propose", None)):
        return spec
    raise TypeError(f"draft_model must be a causal model, a path, a LanguageModel, a draft source or "
                    f"'prompt_lookup'; got {type(spec).__name__}")


_COMPOSES = ("ASAp, AWRS and SMC reweight whole sequences (learnt future-validity estimates, importance "
             "weights, resampling), so their draws are no fixed per-token distribution the speculative "
             "acceptance rule could reproduce; use sampler='masked' (any temperature/top_k/top_p) with draft_model=")


def check_speculative_options(options: Any) -> None:
    """``generate``'s checks for ``draft_model=`` (``ValueError``/``TypeError`` saying why)."""
    k = options.num_speculative_tokens
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"num_speculative_tokens must be a positive int, got {k!r}")
    if options.draft_model is None:
        return
    sampler = options.sampler
    from samplers import MaskedSampler

    masked = (isinstance(sampler, str) and sampler.lower() == "masked") or type(sampler) is MaskedSampler
    if not masked:
        name = sampler if isinstance(sampler, str) else type(sampler).__name__
        raise ValueError(f"draft_model= works with the masked sampler only, not {name!r}: {_COMPOSES}")
    if options.stop_strings:
        raise ValueError("stop= is not supported with draft_model= (speculative decoding)")
    if options.ignore_eos:
        raise ValueError("ignore_eos=True is not supported with draft_model= (speculative decoding)")
