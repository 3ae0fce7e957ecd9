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
   * ``engine.spec_tree.DraftTree(lm, width=2, branch_below=0.6, max_nodes=16)`` — a draft model
     proposing a *token tree*: one child per node, up to ``width`` children where the draft's top
     probability is below ``branch_below``, ``k`` levels, ``max_nodes`` nodes; sampled children
     are drawn without replacement. The whole tree is verified in one target pass
     (``engine.lm.tree_logits``: ``HFCausalLM`` feeds the tree after the cached context with a
     tree attention mask) with the multi-draft rule below.
   * ``engine.jacobi.JacobiDraft()`` (``draft_model="jacobi"`` or ``"lookahead"``) — no draft
     model: the target's own predictions from the last verification (fixed-point guesses along
     the rejected branch) and an n-gram pool of its predictions and of the text, as a
     deterministic token tree (lookahead decoding, Fu et al. 2024).

   A source opts into trees with ``propose_tree`` and into seeing the target's verification
   logits with ``observe_verification`` (both optional; ``propose``'s signature is unchanged).

   Every draft token is checked on a forked matcher before the target sees it; a draft is
   trimmed at its first invalid token and ends after EOS.
2. **Verify.** The target scores every prefix ``context + draft[:i]`` (``i = 0..n``; not the
   prefixes that end before a forced draft, whose logits are never read) in one call
   (``engine.lm.chain_logits``: ``HFCausalLM`` feeds the draft after its cached context as one row
   and reads the logits at every draft position; another ``LanguageModel`` scores the prefixes as
   rows of one ``next_logits`` call). At each position the target's *constrained* distribution ``p`` is the mask of the
   state reached along the draft applied to its logits, then ``process_logits``; ``q`` is the
   draft's distribution, computed the same way. Draft token ``x`` is accepted with probability
   ``min(1, p(x)/q(x))``; at the first rejection the token is drawn from
   ``normalize(max(0, p − q))``; when all are accepted a bonus token is drawn from ``p`` at the
   state after the draft. Greedy (``temperature=0``): a draft token is accepted while it equals
   the target's constrained argmax (the argmax ``engine.decoding`` takes: the masked logits, first
   index on ties), and the argmax is emitted at the first mismatch.
   A token tree is verified by walking it from the root (``engine.spec_tree``): at a node the
   children ``x_1, x_2, …`` are tried in order, ``x_i`` accepted with ``min(1, p(x_i)/q_i(x_i))``
   (``q_i`` the law of that draw given its earlier siblings: a point mass for a deterministic
   proposal, ``q`` minus the earlier siblings for draws without replacement); after each
   rejection ``p ← normalize(max(0, p − q_i))``; the walk descends into the accepted child, and
   where every child is rejected (or at a leaf) the token is drawn from the current ``p``.
   Greedy walks follow the target's constrained argmax. Every tree node is checked on a forked
   matcher first: invalid deterministic nodes are pruned with their subtrees; an invalid sampled
   node stays as a ghost draw that the rule rejects without a target row.
3. **Commit.** Only accepted tokens (and the corrected or bonus one) advance the real matcher;
   drafting and verification walk forks, so nothing needs rolling back. A source with
   ``observe_verification`` then sees what the target computed (``Verification``).

How many tokens to draft (``k``): a fixed int, or ``"auto"`` — a ``GoodputController`` per
request picks each round's ``k`` in ``0..max_k`` maximising expected committed tokens per second
(SmartSpec's goodput, Liu et al. 2024): ``E[k] = (1 − a^(k+1)) / (1 − a)`` tokens per target call
for a per-token acceptance rate ``a`` (an exponential moving average over the drafts verified so
far), over ``time(k) = t_target(k) + k·t_draft`` with both costs measured online. ``k = 0`` (plain
decoding, forced runs still free) is chosen when drafting does not pay; a one-token probe every
few such rounds keeps ``a`` measured. ``DraftModel(stop_below=h)`` also ends a draft early when the
draft model's own probability of the token it proposes is below ``h`` (SpecDec++'s stopping rule,
with the probability as the score).

``filter_drafts=False`` (a benchmark baseline) sends the source's proposal to the target
unchecked: an invalid token is then rejected by verification (the target's constrained ``p``
gives it 0) instead of being trimmed before it, and costs its row of the target call.

Why it is lossless: at every position, conditioned on the tokens before it, the emitted token is
distributed as ``p`` whatever the draft did (Leviathan et al. 2023; Chen et al. 2023), so the
sequence distribution is exactly token-by-token masked sampling from the target — what
``engine.decode`` with the masked sampler draws (not the same random stream, the same law).
Forced drafts are the only allowed token, so ``p`` is a point mass on them and they are always
accepted (without reading the logits). EOS is allowed only at accepting states, as in
``engine.decoding``; a state where the mask holds only EOS ends the sequence without a model call.
``max_tokens`` counts EOS as in ``engine.decoding``: a round drafts at most ``remaining − 1``
tokens so that its last token still fits. Adaptive ``k`` keeps all of this: a round's ``k`` is
chosen from earlier rounds only (their outcomes and timings), never from this round's draws, and
the rule above is exact for every ``k``. The early stop drops a drawn token whose ``q`` is below
the threshold, so a token that reaches verification is drawn from ``q`` conditioned on
``q ≥ h``: that conditional is the ``q`` it is verified with, as for trimmed unconstrained drafts.
An unfiltered invalid token carries ``q`` = a point mass and ``p = 0``: always rejected, and the
token drawn instead comes from ``normalize(max(0, p − q)) = p``.
For trees, the same argument applies child by child: if ``x_i`` is distributed as ``q_i`` given
everything before it, trying ``x_i`` and otherwise recursing on the residual emits ``p`` exactly
(``min(p, q_i) + max(0, p − q_i) = p``; proof in ``engine.spec_tree``), and an accepted child's
own children were drawn given its path only. ``JacobiDraft``'s proposals are functions of what
was committed and verified before, so each is a point mass.

Which samplers compose: only locally normalised ones — the masked sampler (``MaskedSampler``,
any temperature/top-k/top-p). The acceptance rule reproduces a *per-token* distribution ``p``
conditioned on the prefix. ASAp, AWRS and SMC target the model conditioned on the whole grammar:
ASAp reweights each step by learnt estimates of future validity and carries state across
sequences, AWRS and SMC attach importance weights to sequences (and SMC resamples particles), so
their draws are not a fixed per-step distribution the rule could match; composing them would need
the weights carried through acceptance, which this module does not do. ``generate`` refuses them
with ``draft_model=``.

Budget-aware closing (``closing=``, ``engine.closing.BudgetClosing``) keeps the law of
``engine.decoding``'s masked sampler under closing, which draws from ``p`` and, while a token is
refused by the budget, draws again without it. Verification emits each token ``y`` distributed
as ``p`` given the tokens before it, which is that procedure's first draw: when closing admits
``y`` it is committed; when it refuses ``y``, the round stops there and the procedure goes on from
the target's logits at that position with ``y`` removed (one more target call, counted), so the
emitted token is distributed exactly as the sequential sampler's. ``budget_steered`` counts these
positions. Drafts past a refused token are dropped unverified.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from engine.closing import BudgetClosing
from engine.decoding import FinishReason
from engine.lm import HFCausalLM, LanguageModel, chain_logits, read_output_vocab
from engine.spec_tree import (
    _MAX_FORCED,
    Draft,
    TokenTree,
    Verification,
    _distribution,
    _fit,
    _greedy,
    _masked_logits,
    draft_tree,
    verify_tree,
)
from grammars import TokenVocabulary, allocate_token_bitmask
from grammars.bitmask import bits_at, unpack_bits
from samplers import (
    NoAllowedToken,
    SamplingParams,
    sample_categorical,
)
from samplers.masked import masked_draw
from samplers.narrowing import NarrowedMatcher
from samplers._numeric import uniforms
from samplers.base import process_logits

__all__ = [
    "Draft",
    "DraftModel",
    "DraftSource",
    "ForcedTokens",
    "GoodputController",
    "PromptLookup",
    "SpeculativeOutput",
    "load_draft_lm",
    "resolve_draft",
    "speculative_decode",
]

#: the default sampling parameters (plain softmax at temperature 1)
_DEFAULT_PARAMS = SamplingParams()
#: the largest ``k`` ``"auto"`` drafts by default: E[k] grows by a^k per extra token, under 0.2
#: beyond 8 tokens for a = 0.8, while each extra token costs a draft step and a verified row
DEFAULT_MAX_SPECULATIVE_TOKENS = 8


@runtime_checkable
class DraftSource(Protocol):
    """Proposes up to ``k`` tokens after ``context`` (prompt + generated + drafts so far).

    ``matcher`` is a fork at the state after ``context`` that the source may advance freely. The
    caller checks every token again and trims at the first invalid one.

    Two optional members (looked up with ``getattr``, so a source without them keeps working):
    ``propose_tree(context, matcher, k, params, generator, vocab) -> TokenTree`` (a token tree of at
    most ``k`` levels, ``engine.spec_tree``; the decoder then verifies the tree instead of calling
    ``propose``) and ``observe_verification(verification)`` (called after every target call with
    an ``engine.spec_tree.Verification``: the target's logits at the verified positions, the
    accepted nodes and the committed tokens; ``engine.jacobi.JacobiDraft`` drafts from them).
    """

    def propose(self, context: list[int], matcher, k: int, params: SamplingParams,
                generator: torch.Generator | None, vocab: TokenVocabulary) -> list[Draft]:
        ...


@dataclass
class DraftModel:
    """A smaller causal ``LanguageModel`` (same tokenizer) drafting under the same constraint.

    ``constrained=False`` drafts from the unmasked distribution and lets the check trim the draft
    at its first invalid token (its ``q`` is then conditioned on validity; see the module
    docstring). ``stop_below``: end the draft before a token whose draft probability is below
    this (SpecDec++-style early stop: a low-confidence token is likely rejected and costs a verified
    row; greedy drafts use the probability at temperature 1). ``calls`` counts the draft model's
    ``next_logits`` calls.
    """

    lm: LanguageModel
    constrained: bool = True
    calls: int = 0
    stop_below: float = 0.0

    def __post_init__(self) -> None:
        h = self.stop_below
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0.0 <= h < 1.0:
            raise ValueError(f"stop_below must be a probability in [0, 1), got {h!r}")

    def propose(self, context, matcher, k, params, generator, vocab):
        width, eos = vocab.logits_width, vocab.eos_token_ids
        subset = getattr(self.lm, "output_ids", None)  # a reduced output vocabulary: work on it alone
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
                if subset is not None and self.constrained:
                    draft = self._draw_among(subset, logits, matcher, width, params, generator)
                else:
                    draft = self._draw(logits, matcher, width, params, generator)
            except NoAllowedToken:
                break
            if draft is None:  # stopped early: the draft model is unsure of this token
                break
            drafts.append(draft)
            if not matcher.allows(draft.token):
                break  # an invalid draft token (constrained=False): the caller's check trims it
            matcher.advance(draft.token)
            ctx.append(draft.token)
            if draft.token in eos:
                break
        return drafts

    def _draw(self, logits, matcher, width, params, generator) -> Draft | None:
        """The next draft token and its ``q``; ``None`` when the early stop ends the draft here."""
        h = self.stop_below
        if self.constrained:
            masked = _masked_logits(logits, matcher, width)
            if params.temperature == 0:
                best = _greedy(masked)
                return None if h and _confidence(masked, best) < h else Draft(best)
            q = _distribution(masked, params)
            token = sample_categorical(q, generator)
            if h and float(q[token]) < h:
                return None
            return Draft(token, _kept(q, h) if h else q)  # the law of a token that is not stopped
        if params.temperature == 0:
            best = int(torch.argmax(logits))
            return None if h and _confidence(logits, best) < h else Draft(best)
        q = torch.softmax(process_logits(logits, params).double(), dim=-1).cpu()
        token = sample_categorical(q, generator)
        if not matcher.allows(token):
            return Draft(token)  # invalid: trimmed before verification
        if h and float(q[token]) < h:
            return None
        words = allocate_token_bitmask(1, width)
        matcher.fill_mask(words, 0)
        valid = q * torch.from_numpy(unpack_bits(words[0], width)).to(q.dtype)
        return Draft(token, _kept(valid, h))  # the law of a draft token that passes the check


    def _draw_among(self, subset: torch.Tensor, logits, matcher, width, params, generator) -> Draft | None:
        """``_draw`` under the mask for a draft model whose logits are ``-inf`` outside ``subset``
        (its output vocabulary, sorted): the same law, with the mask read, the softmax taken and the
        token drawn over the subset only instead of the full width. ``q`` is scattered back to
        full width for verification."""
        h = self.stop_below
        words = allocate_token_bitmask(1, width)
        matcher.fill_mask(words, 0)
        allowed = torch.from_numpy(bits_at(words[0], subset.numpy()))
        masked = torch.where(allowed, logits[subset].float(), float("-inf"))
        if params.temperature == 0:
            best = _greedy(masked)  # the first maximum: ids ascend, as over the full row
            return None if h and _confidence(masked, best) < h else Draft(int(subset[best]))
        q_sub = _distribution(masked, params)
        pick = sample_categorical(q_sub, generator)
        if h and float(q_sub[pick]) < h:
            return None
        q = torch.zeros(width, dtype=q_sub.dtype)
        q[subset] = _kept(q_sub, h) if h else q_sub
        return Draft(int(subset[pick]), q)


def _confidence(logits: torch.Tensor, token: int) -> float:
    """``token``'s probability under ``softmax(logits)`` at temperature 1 (a greedy draft's score)."""
    return float(torch.softmax(logits.double(), dim=-1)[token])


def _kept(q: torch.Tensor, stop_below: float) -> torch.Tensor:
    """``q`` renormalised over the tokens the early stop keeps (``q ≥ stop_below``): the law of a
    draft token that reaches verification. The drawn token is kept, so the sum is positive."""
    if stop_below:
        q = torch.where(q >= stop_below, q, torch.zeros_like(q))
    return q / q.sum()


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
class GoodputController:
    """Chooses each round's ``k`` (drafted tokens, forced runs aside) for one request: the ``k`` in
    ``0..max_k`` with the most expected committed tokens per second (SmartSpec's goodput).

    ``expected_tokens(k) = (1 − a^(k+1)) / (1 − a)`` (``k + 1`` at ``a = 1``): each draft token is
    accepted with probability ``a`` while the ones before it were, plus the corrected or bonus
    token. ``step_seconds(k) = target_s + k·target_row_s + k·draft_s``: a target call verifying
    ``k`` drafts (forced ones are free: they add no scored row), and ``k`` draft steps. Every estimate is a field, so a caller (a test, a server
    carrying estimates across requests) can set them; ``observe`` updates them after each round:
    ``acceptance`` per verified draft token (an EMA with weight ``smoothing``; a token trimmed as
    invalid counts as a rejection), ``draft_s`` per proposed token and the target's cost as a
    least-squares line through the EMA of its time at each number of verified drafts
    (``cost_smoothing``); ``measure_costs=False`` keeps the given costs and learns the acceptance
    only. Until both costs are known it drafts ``start_k``.

    ``choose`` is a small state machine: after ``probe_every`` rounds in a row at ``k = 0`` it
    drafts one token, so a source that starts agreeing with the target is noticed (0: never).
    Ties go to the smaller ``k``. Not thread-safe; one per request.
    """

    max_k: int = DEFAULT_MAX_SPECULATIVE_TOKENS
    acceptance: float = 0.5
    target_s: float | None = None
    target_row_s: float = 0.0
    draft_s: float | None = None
    smoothing: float = 0.1
    cost_smoothing: float = 0.3
    probe_every: int = 8
    start_k: int = 2
    measure_costs: bool = True
    _idle: int = field(default=0, repr=False)
    _verify_s: dict[int, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("max_k", "probe_every", "start_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        for name in ("acceptance", "smoothing", "cost_smoothing"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        for name in ("target_s", "draft_s", "target_row_s"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"{name} must be seconds >= 0, got {value!r}")

    def expected_tokens(self, k: int) -> float:
        """Expected tokens one target call commits with ``k`` drafts at the current acceptance."""
        a = self.acceptance
        return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)

    def step_seconds(self, k: int) -> float:
        """Expected seconds of a round with ``k`` drafts (costs not yet measured count as 0)."""
        return (self.target_s or 0.0) + k * (self.target_row_s + (self.draft_s or 0.0))

    def goodput(self, k: int) -> float:
        """Expected committed tokens per second with ``k`` drafts."""
        seconds = self.step_seconds(k)
        return self.expected_tokens(k) / seconds if seconds > 0 else float(k + 1)

    def best_k(self) -> int:
        """The ``k`` with the highest goodput (the smaller on ties), without probing."""
        if self.target_s is None or self.draft_s is None:
            return min(self.start_k, self.max_k)
        return max(range(self.max_k + 1), key=lambda k: (self.goodput(k), -k))

    def choose(self) -> int:
        """This round's ``k``: ``best_k``, or a one-token probe after ``probe_every`` rounds at 0."""
        k = self.best_k()
        if k > 0:
            self._idle = 0
            return k
        self._idle += 1
        if self.probe_every and self.max_k > 0 and self._idle > self.probe_every:
            self._idle = 0
            return 1
        return 0

    def observe(self, *, proposed: int, accepted: int, rejected: bool, draft_s: float, verified: int,
                verify_s: float, timed: bool = True) -> None:
        """Update the estimates after a round: ``proposed`` source tokens (the trimmed one included)
        took ``draft_s`` seconds; ``accepted`` of them were accepted, then one was ``rejected``
        (or trimmed) or not; the target call verified ``verified`` drafts in ``verify_s``.
        ``timed=False``: the timings are not typical (a prefill) and only the acceptance learns."""
        w = self.smoothing
        for _ in range(accepted):
            self.acceptance += w * (1.0 - self.acceptance)
        if rejected:
            self.acceptance -= w * self.acceptance
        if not (self.measure_costs and timed):
            return
        c = self.cost_smoothing
        if proposed > 0:
            per_token = draft_s / proposed
            self.draft_s = per_token if self.draft_s is None else (1 - c) * self.draft_s + c * per_token
        old = self._verify_s.get(verified)
        self._verify_s[verified] = verify_s if old is None else (1 - c) * old + c * verify_s
        self._fit_target()

    def _fit_target(self) -> None:
        points = sorted(self._verify_s.items())
        if len(points) == 1:
            n, t = points[0]
            self.target_s = max(0.0, t - n * self.target_row_s)
            return
        mean_n = sum(n for n, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        spread = sum((n - mean_n) ** 2 for n, _ in points)
        slope = max(0.0, sum((n - mean_n) * (t - mean_t) for n, t in points) / spread)
        self.target_row_s = slope
        self.target_s = max(0.0, mean_t - slope * mean_n)


@dataclass
class SpeculativeOutput:
    """One sequence: generated tokens (EOS excluded), bytes, how it ended, and the counters.

    ``target_calls``: target ``next_logits`` calls; ``drafted``: draft tokens that reached
    verification (after trimming; forced ones included), ``trimmed``: rounds whose proposal had an
    invalid token (cut there; with ``filter_drafts=False`` sent to the target instead),
    ``invalid_tokens``: proposed tokens from the first invalid one on (not verified when drafts
    are filtered), ``accepted``: drafts accepted, ``forced_tokens``: forced drafts accepted;
    ``accepted_per_call``: tokens committed by each target call (accepted drafts plus the
    corrected or bonus token); ``k_per_call``: the ``k`` each round asked the source for.
    ``per_token_s``: seconds per round; ``draft_s``/``verify_s``: seconds in the draft source and
    in verification (target call, masks, acceptance), summed. Token trees (``propose_tree``
    sources): ``drafted`` counts the verified nodes, ``trimmed`` the rounds with a pruned node,
    ``invalid_tokens`` the pruned nodes; ``tree_nodes`` the source's nodes checked and
    ``tree_check_s`` the seconds the check took (fork, ``allows``, ``advance`` per node).
    """

    token_ids: list[int]
    text: bytes
    finish_reason: FinishReason
    target_calls: int = 0
    drafted: int = 0
    trimmed: int = 0
    invalid_tokens: int = 0
    accepted: int = 0
    forced_tokens: int = 0
    accepted_per_call: list[int] = field(default_factory=list)
    k_per_call: list[int] = field(default_factory=list)
    first_token_s: float | None = None
    per_token_s: list[float] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    tree_nodes: int = 0
    tree_check_s: float = 0.0
    budget_steered: int = 0  # positions where budget-aware closing refused the verified token

    @property
    def tokens_per_call(self) -> float:
        """Mean tokens committed per target call (1.0 is plain decoding)."""
        return sum(self.accepted_per_call) / len(self.accepted_per_call) if self.accepted_per_call else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / verified source drafts (forced ones aside); None when none was verified."""
        verified = self.drafted - self.forced_tokens
        return (self.accepted - self.forced_tokens) / verified if verified else None


def _controller(k: Any, max_k: int) -> GoodputController | None:
    """``None`` for a fixed ``k``; a fresh ``GoodputController`` for ``"auto"``; a given one as is."""
    if isinstance(k, GoodputController):
        return k
    if k == "auto":
        return GoodputController(max_k=max_k)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k (num_speculative_tokens) must be an int >= 0, 'auto' or a GoodputController, got {k!r}")
    return None


def speculative_decode(
    target_lm: LanguageModel,
    draft: DraftSource,
    vocab: TokenVocabulary,
    prompt_ids: Sequence[int],
    matcher,
    *,
    k: int | str | GoodputController = 4,
    max_k: int = DEFAULT_MAX_SPECULATIVE_TOKENS,
    max_tokens: int = 256,
    params: SamplingParams = _DEFAULT_PARAMS,
    generator: torch.Generator | None = None,
    filter_drafts: bool = True,
    closing: BudgetClosing | None = None,
) -> SpeculativeOutput:
    """Generate one sequence from ``matcher``'s state (advanced in place) with ``draft`` proposing
    up to ``k`` tokens per target call; the output's law is masked sampling from ``target_lm``.

    ``k``: an int, ``"auto"`` (a new ``GoodputController(max_k=max_k)`` adapts it each round) or a
    ``GoodputController`` (used and updated as is). ``filter_drafts=False``: proposals reach the
    target unchecked (a baseline; see the module docstring). ``closing``: budget-aware closing,
    its budget counted from ``matcher``'s position (see the module docstring).

    Raises ``ValueError`` for bad arguments and ``NoAllowedToken`` where the grammar allows nothing.
    """
    if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 0:
        raise ValueError(f"max_k (max_speculative_tokens) must be an int >= 0, got {max_k!r}")
    controller = _controller(k, max_k)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
    trees = callable(getattr(draft, "propose_tree", None))
    if not (trees or callable(getattr(draft, "propose", None))):
        raise TypeError(f"draft must be a draft source (DraftModel, DraftTree, JacobiDraft, PromptLookup, "
                        f"ForcedTokens), got {type(draft).__name__}")
    if trees and not filter_drafts:
        raise ValueError("filter_drafts=False is for chain drafts; a token tree is always checked node by node")
    observe = getattr(draft, "observe_verification", None)
    observe = observe if callable(observe) else None
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
        round_k = controller.choose() if controller is not None else k
        from_source = out.accepted - out.forced_tokens
        if trees:
            drafted = draft_tree(draft, context, matcher, min(round_k, remaining - 1), remaining - 1, params,
                                 generator, vocab)
            out.tree_nodes += drafted.proposed
            out.tree_check_s += drafted.check_s
            verify_start = time.perf_counter()
            committed, rejected, seen = verify_tree(target_lm, context, matcher, drafted.tree, width, params,
                                                    generator, out)
            verified = drafted.source_nodes
            n_drafted = sum(not node.pruned for node in drafted.tree.nodes)
        else:
            drafted = _draft(draft, context, matcher, min(round_k, remaining - 1), remaining - 1, params, generator,
                             vocab, filter_drafts)
            drafts = drafted.drafts
            verify_start = time.perf_counter()
            committed, rejected, logits = _verify(target_lm, context, matcher, drafts, width, params, generator, out)
            seen = _chain_verification(context, drafts, logits, committed, rejected) if observe is not None else None
            verified = sum(not d.forced for d in drafts)
            n_drafted = len(drafts)
        out.trimmed += drafted.invalid > 0
        out.invalid_tokens += drafted.invalid
        now = time.perf_counter()
        if observe is not None:
            observe(seen)
        if controller is not None:  # a trimmed (or unfiltered invalid) token is a rejection too
            controller.observe(proposed=drafted.proposed, accepted=out.accepted - out.forced_tokens - from_source,
                               rejected=rejected or drafted.invalid > 0, draft_s=drafted.seconds,
                               verified=verified, verify_s=now - verify_start,
                               timed=out.target_calls > 0)  # the first round pays the draft's prefill
        out.target_calls += 1
        out.drafted += n_drafted
        out.accepted_per_call.append(len(committed))
        out.k_per_call.append(round_k)
        out.draft_s += drafted.seconds
        out.verify_s += now - verify_start
        if out.first_token_s is None:
            out.first_token_s = now - started
        out.per_token_s.append(now - last)
        last = now
        for token in committed:
            steered = closing is not None and token not in eos and not closing.admits(matcher, token)
            if steered:
                token = _closing_redraw(target_lm, prompt + out.token_ids, matcher, closing, token, width, params,
                                        generator, vocab)
                out.target_calls += 1
                out.budget_steered += 1
            matcher.advance(token)
            if token in eos:
                out.finish_reason = "stop"
                break
            out.token_ids.append(token)
            text += vocab.token_bytes[token] if token < vocab.size else b""
            if steered:
                break  # the rest of the round followed the refused token
    out.text = bytes(text)
    return out


def _closing_redraw(target_lm, context, matcher, closing: BudgetClosing, refused: int, width: int,
                    params: SamplingParams, generator, vocab: TokenVocabulary) -> int:
    """The token the sequential sampler under closing draws at ``context`` after its first draw,
    ``refused``, was refused by the budget: the same draw procedure with ``refused`` removed."""
    logits = target_lm.next_logits([context])[0][:width].detach().float().clone()
    logits[refused] = float("-inf")
    narrowed = NarrowedMatcher(matcher, closing.admits, vocab, lazy_checks=max(0, closing.lazy_checks - 1))
    return masked_draw(logits, narrowed, params, generator)


@dataclass
class _Drafted:
    """One round's drafts (forced run first) and what the source cost: ``proposed`` source tokens in
    ``seconds``; ``invalid`` tokens from the first invalid one on (trimmed unless unfiltered)."""

    drafts: list[Draft]
    proposed: int = 0
    invalid: int = 0
    seconds: float = 0.0


def _draft(source, context, matcher, k, room, params, generator, vocab, filter_drafts=True) -> _Drafted:
    """The forced run (free, within ``room``) then up to ``k`` source tokens, checked on a fork."""
    fork = matcher.fork()
    out = _Drafted([Draft(t, None, forced=True) for t in fork.forced_tokens(min(room, _MAX_FORCED))])
    for d in out.drafts:
        fork.advance(d.token)
    k = min(k, room - len(out.drafts))
    if k <= 0 or fork.is_terminated():
        return out
    start = time.perf_counter()
    proposed = list(source.propose(context + [d.token for d in out.drafts], fork.fork(), k, params, generator,
                                   vocab))[:k]
    out.seconds = time.perf_counter() - start
    out.proposed = len(proposed)
    valid = True
    for i, d in enumerate(proposed):
        token = int(d.token)
        if valid and not fork.allows(token):
            valid = False
            out.invalid = len(proposed) - i
            if filter_drafts:
                break  # trimmed at the first invalid token
        if valid:
            forced = bool(d.forced) and fork.forced_tokens(1) == [token]  # trusted only when it is
            fork.advance(token)
            out.drafts.append(Draft(token, d.q, forced))
        else:  # unfiltered: verification rejects it (p = 0) and never reaches what follows
            out.drafts.append(Draft(token, None))
        if token in vocab.eos_token_ids:
            break
    return out


def _chain_verification(context, drafts, logits, committed, rejected) -> Verification:
    """What the target saw in a chain round, for a source that observes verifications (built only
    for such a source)."""
    accepted = list(range(len(committed) - (1 if rejected or len(committed) > len(drafts) else 0)))
    return Verification(list(context), TokenTree.chain(drafts), {i - 1: row for i, row in logits.items()},
                        accepted, committed)


def _verify(target_lm, context, matcher, drafts, width, params, generator, out):
    """The tokens this round commits (accepted drafts, then the corrected or bonus token), whether
    a draft was rejected, and the target's logits by position (``i``: after ``context + drafts[:i]``)."""
    # forced drafts are accepted without reading their logits: score only the other positions
    scored = [i for i, d in enumerate(drafts) if not d.forced] + [len(drafts)]
    rows = chain_logits(target_lm, context, [d.token for d in drafts], scored)
    logits = dict(zip(scored, rows))
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
                return committed, True, logits
        else:
            p = _distribution(masked, params)
            px = float(p[d.token])
            qx = 1.0 if d.q is None else float(d.q[d.token])
            ratio = px / qx if qx > 0 else 0.0
            if ratio < 1.0 and not float(uniforms(1, generator)[0]) < ratio:
                committed.append(_residual(p, d, generator))
                return committed, True, logits
        out.accepted += 1
        committed.append(d.token)
        state.advance(d.token)
        if state.is_terminated():  # EOS accepted: no bonus
            return committed, False, logits
    masked = _masked_logits(logits[len(drafts)], state, width)
    committed.append(_greedy(masked) if greedy else sample_categorical(_distribution(masked, params), generator))
    return committed, False, logits


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


def load_draft_lm(path: str | os.PathLike[str], *, device=None, dtype=None, local_files_only: bool = False) -> HFCausalLM:
    """A causal draft model from a folder or hub id; a folder with an ``output_vocab.json``
    (``engine.distill``) gets its reduced output vocabulary (``HFCausalLM(output_ids=...)``)."""
    local = os.path.isdir(os.path.expanduser(str(path)))
    output_ids = read_output_vocab(path) if local else None
    return HFCausalLM.from_pretrained(os.path.expanduser(str(path)) if local else str(path), device=device,
                                      dtype=dtype, local_files_only=local_files_only or local, output_ids=output_ids)


def resolve_draft(spec: Any, *, device=None, dtype=None) -> DraftSource:
    """A draft source from ``generate``'s ``draft_model=``: ``"prompt_lookup"``, ``"forced"``,
    ``"jacobi"`` / ``"lookahead"`` (a fresh ``engine.jacobi.JacobiDraft``), a source instance
    (``DraftTree`` for token trees), a ``LanguageModel``, a transformers causal LM or a path / hub id;
    a masked-diffusion model (a ``MaskedDiffusionLM``, a transformers masked LM, a checkpoint whose
    config names one, or ``"diffusion:PATH"``) drafts through ``engine.diffusion_draft.DiffusionDraft``."""
    from engine.diffusion_draft import DiffusionDraft  # it builds on this module
    from engine.diffusion_lm import (
        HFMaskedDiffusionLM,
        MaskedDiffusionLM,
        is_masked_diffusion_checkpoint,
        is_masked_diffusion_model,
    )

    if isinstance(spec, str) and spec.startswith("diffusion:"):
        return DiffusionDraft.from_pretrained(os.path.expanduser(spec.removeprefix("diffusion:")), device=device,
                                              dtype=dtype)
    if isinstance(spec, str) and spec in ("prompt_lookup", "forced"):
        return PromptLookup() if spec == "prompt_lookup" else ForcedTokens()
    if isinstance(spec, str) and spec in ("jacobi", "lookahead"):
        from engine.jacobi import JacobiDraft

        return JacobiDraft()
    if isinstance(spec, (DraftModel, PromptLookup, ForcedTokens)):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        local = os.path.exists(os.path.expanduser(str(spec)))
        source = os.path.expanduser(str(spec)) if local else str(spec)
        if is_masked_diffusion_checkpoint(source, local_files_only=local):
            return DiffusionDraft.from_pretrained(source, device=device, dtype=dtype)
        return DraftModel(load_draft_lm(source, device=device, dtype=dtype, local_files_only=local))
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        PreTrainedModel = ()
    if PreTrainedModel and isinstance(spec, PreTrainedModel):
        if is_masked_diffusion_model(spec):
            return DiffusionDraft(HFMaskedDiffusionLM(spec, device=device, dtype=dtype))
        return DraftModel(HFCausalLM(spec, device=device, dtype=dtype))
    if isinstance(spec, MaskedDiffusionLM) and not isinstance(spec, LanguageModel):
        return DiffusionDraft(spec)
    if isinstance(spec, LanguageModel):
        return DraftModel(spec)
    if callable(getattr(spec, "propose", None)) or callable(getattr(spec, "propose_tree", None)):
        return spec
    raise TypeError(f"draft_model must be a causal model, a masked-diffusion model, a path, a LanguageModel, "
                    f"a draft source, 'prompt_lookup', 'forced', 'jacobi' or 'diffusion:PATH'; got {type(spec).__name__}")


_COMPOSES = ("ASAp, AWRS and SMC reweight whole sequences (learnt future-validity estimates, importance "
             "weights, resampling), so their draws are no fixed per-token distribution the speculative "
             "acceptance rule could reproduce; use sampler='masked' (any temperature/top_k/top_p) with draft_model=")


def check_speculative_options(options: Any) -> None:
    """``generate``'s checks for ``draft_model=`` (``ValueError``/``TypeError`` saying why)."""
    k = options.num_speculative_tokens
    if k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"num_speculative_tokens must be a positive int or 'auto', got {k!r}")
    most = options.max_speculative_tokens
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise ValueError(f"max_speculative_tokens must be a positive int, got {most!r}")
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
