"""Exact enumeration over small finite grammars: the ground truth for sampler tests and benchmarks.

A *logits function* ``logits_fn(prefix) -> 1-D tensor`` is a language model over token ids: the
next-token logits after the generated ``prefix`` (prompt conditioning is the caller's business).
For a grammar whose token language is finite (or cut at ``max_tokens``), this module computes

- ``exact_target``: the model conditioned on the grammar, ``Q(y) = P(y)·1[y ∈ L] / Z`` — the
  distribution ASAp converges to and SMC estimates (``Z`` comes back too);
- ``exact_masked``: the locally constrained (GCD) distribution, what ``MaskedSampler`` draws from
  and what AWRS draws from token by token;
- ``exact_proposal``: the sequence distribution of any per-step rule ``step(prefix, matcher)``,
  e.g. ASAp's current proposal (``exact_asap``);

plus ``kl_divergence``, ``total_variation``, ``empirical``, ``chisquare_pvalue`` and test aids: ``hashed_logits_fn``
(a scripted model whose logits are a fixed pseudo-random function of the prefix) and
``reference_decode`` (a minimal decoding loop driving a ``TokenSampler``, over ``draw_sequence``;
the engine owns the real one). Sequences are tuples of token ids ending with the EOS id the grammar accepted.

Everything is plain DFS over the grammar's allowed tokens, one model call per prefix: fine for a
few thousand prefixes, hopeless beyond. ``max_tokens`` bounds the depth; a grammar with longer
sequences raises ``ValueError`` unless ``truncate=True``, which conditions on ``|y| <= max_tokens``.
Dead ends — reachable states where no token is allowed, possible with vocabularies that cannot
spell every continuation — end no sequence (their mass is lost, so GCD's total is then below 1).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from typing import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np
import torch

from samplers._numeric import allowed_mask
from samplers.base import SamplingParams
from samplers.masked import masked_distribution
from samplers.base import process_logits

__all__ = [
    "LogitsFn",
    "Distribution",
    "language",
    "exact_proposal",
    "exact_target",
    "exact_masked",
    "exact_asap",
    "kl_divergence",
    "total_variation",
    "empirical",
    "normalize",
    "chisquare_pvalue",
    "hashed_logits_fn",
    "batched",
    "draw_sequence",
    "reference_decode",
]

LogitsFn = Callable[[Sequence[int]], torch.Tensor]
#: A distribution over complete token sequences (tuples ending with EOS).
Distribution = dict[tuple[int, ...], float]
StepFn = Callable[[tuple[int, ...], object], torch.Tensor]


def _walk(matcher, width: int, max_tokens: int, truncate: bool, visit) -> None:
    """DFS over every allowed token sequence; ``visit(prefix, matcher, allowed_ids)`` returns the
    ids to descend into (a subset of ``allowed_ids``); sequences end at EOS (terminated matcher)."""
    stack: list[tuple[tuple[int, ...], object]] = [((), matcher.fork())]
    while stack:
        prefix, m = stack.pop()
        if m.is_terminated():
            continue
        if len(prefix) >= max_tokens:
            if truncate:
                continue
            raise ValueError(
                f"the grammar has sequences longer than max_tokens={max_tokens} (prefix {list(prefix)}); "
                "raise max_tokens or pass truncate=True to condition on the length bound"
            )
        ids = np.flatnonzero(allowed_mask(m, width))
        if ids.size == 0:
            continue  # a dead end (no token continues the text, e.g. a vocabulary without single bytes)
        for token in visit(prefix, m, ids):
            child = m.fork()
            child.advance(int(token))
            stack.append((prefix + (int(token),), child))


def language(matcher, width: int, *, max_tokens: int = 32, truncate: bool = False) -> list[tuple[int, ...]]:
    """Every complete token sequence (ending with EOS) the grammar accepts from ``matcher``'s state."""
    out: list[tuple[int, ...]] = []

    def visit(prefix, m, ids):
        for token in ids:
            probe = m.fork()
            probe.advance(int(token))
            if probe.is_terminated():
                out.append(prefix + (int(token),))
        return ids

    _walk(matcher, width, max_tokens, truncate, visit)
    return sorted(out)


def exact_proposal(step: StepFn, matcher, width: int, *, max_tokens: int = 32, truncate: bool = False) -> Distribution:
    """Sequence probabilities of the per-step rule ``step(prefix, matcher) -> probs[width]``.

    Returns the product of step probabilities for every complete sequence (branches of zero
    probability are pruned). Not renormalised: with ``truncate=True`` the total is the probability
    of finishing within ``max_tokens``.
    """
    out: Distribution = {}
    logp: dict[tuple[int, ...], float] = {(): 0.0}

    def visit(prefix, m, ids):
        probs = step(prefix, m).detach().to(torch.float64).reshape(-1)
        base = logp.pop(prefix)
        keep = []
        for token in ids:
            p = float(probs[token])
            if p <= 0.0:
                continue
            probe = m.fork()
            probe.advance(int(token))
            seq = prefix + (int(token),)
            if probe.is_terminated():
                out[seq] = math.exp(base + math.log(p))
            else:
                logp[seq] = base + math.log(p)
                keep.append(token)
        return keep

    _walk(matcher, width, max_tokens, truncate, visit)
    return out


def normalize(dist: Mapping[tuple[int, ...], float]) -> Distribution:
    """``dist`` divided by its total (``ValueError`` when the total is 0)."""
    total = math.fsum(dist.values())
    if not total > 0:
        raise ValueError("cannot normalise a distribution with zero total mass")
    return {k: v / total for k, v in dist.items()}


def _lm_step(logits_fn: LogitsFn, params: SamplingParams) -> StepFn:
    def step(prefix, matcher):
        return torch.softmax(process_logits(logits_fn(list(prefix)).reshape(-1), params), dim=-1)

    return step


def exact_target(
    logits_fn: LogitsFn,
    matcher,
    width: int,
    *,
    params: SamplingParams = SamplingParams(),
    max_tokens: int = 32,
    truncate: bool = False,
) -> tuple[Distribution, float]:
    """``(Q, Z)``: the model conditioned on the grammar, ``Q(y) = P(y)/Z`` over ``y ∈ L``.

    ``P`` is the model after ``process_logits`` on the *unmasked* logits (the definition AWRS, SMC
    and ASAp use); ``Z = Σ_{y∈L} P(y)`` is the probability that an unconstrained sample is valid.
    """
    joint = exact_proposal(_lm_step(logits_fn, params), matcher, width, max_tokens=max_tokens, truncate=truncate)
    z = math.fsum(joint.values())
    return normalize(joint), z


def exact_masked(
    logits_fn: LogitsFn,
    matcher,
    width: int,
    *,
    params: SamplingParams = SamplingParams(),
    max_tokens: int = 32,
    truncate: bool = False,
) -> Distribution:
    """The locally constrained (GCD) sequence distribution: mask, ``process_logits``, renormalise per step."""

    def step(prefix, m):
        return masked_distribution(logits_fn(list(prefix)).reshape(-1), m, params)

    return _locally_normalised(step, matcher, width, max_tokens, truncate)


def exact_asap(
    sampler,
    key: Hashable,
    logits_fn: LogitsFn,
    matcher,
    width: int,
    *,
    max_tokens: int = 32,
    truncate: bool = False,
) -> Distribution:
    """ASAp's *current* proposal over sequences: every step weights ``p(t)`` by the trie's ``ĉ``.

    ``sampler`` is an ``ASAp`` instance; ``key`` selects its trie (an unseen key gives GCD).
    """
    from samplers.asap import asap_weights  # local: asap imports this module's neighbours only

    trie = sampler.trie(key)

    def step(prefix, m):
        probs = torch.softmax(process_logits(logits_fn(list(prefix)).reshape(-1), sampler.params), dim=-1)
        node = trie.lookup(prefix) if trie is not None else None
        tokens, chats = trie.child_estimates(node) if node is not None else ([], [])
        weights = asap_weights(probs.numpy(), allowed_mask(m, probs.shape[0]), tokens, chats)
        total = float(weights.sum())
        return torch.from_numpy(weights / total if total > 0 else weights)

    return _locally_normalised(step, matcher, width, max_tokens, truncate)


def _locally_normalised(step: StepFn, matcher, width: int, max_tokens: int, truncate: bool) -> Distribution:
    """``exact_proposal`` of a rule normalised at every step: a distribution already, except that
    ``truncate`` drops the sequences longer than ``max_tokens``, so it is conditioned on the rest."""
    dist = exact_proposal(step, matcher, width, max_tokens=max_tokens, truncate=truncate)
    return normalize(dist) if truncate else dist


def kl_divergence(p: Mapping[tuple[int, ...], float], q: Mapping[tuple[int, ...], float]) -> float:
    """``KL(p || q) = Σ p log(p/q)`` in nats; ``inf`` when ``p`` puts mass where ``q`` has none."""
    total = 0.0
    for y, py in p.items():
        if py <= 0.0:
            continue
        qy = q.get(y, 0.0)
        if qy <= 0.0:
            return float("inf")
        total += py * math.log(py / qy)
    return max(total, 0.0)


def total_variation(p: Mapping[tuple[int, ...], float], q: Mapping[tuple[int, ...], float]) -> float:
    """``½ Σ |p − q|`` over the union of supports."""
    keys = set(p) | set(q)
    return 0.5 * math.fsum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def empirical(samples: Iterable[Sequence[int]]) -> Distribution:
    """The empirical distribution of a list of token sequences."""
    counts = Counter(tuple(s) for s in samples)
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no samples")
    return {k: c / n for k, c in counts.items()}


def chisquare_pvalue(
    counts: Mapping[Hashable, int], probs: Mapping[Hashable, float], *, min_expected: float = 5.0
) -> float:
    """Pearson χ² goodness-of-fit p-value of observed ``counts`` against expected ``probs``.

    Outcomes whose expected count is below ``min_expected`` are pooled into one cell (the χ²
    approximation needs ~5 per cell); an observed outcome with zero expected probability gives
    p = 0. The survival function of χ²(k) is ``Q(k/2, x/2)``, the regularised upper incomplete
    gamma function (``torch.special.gammaincc``), so no scipy is needed.
    """
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no observations")
    total_p = math.fsum(probs.values())
    if any(c > 0 and probs.get(k, 0.0) <= 0.0 for k, c in counts.items()):
        return 0.0
    cells: list[tuple[float, float]] = []  # (observed, expected)
    pooled_obs = pooled_exp = 0.0
    for k, p in probs.items():
        expected = n * p / total_p
        observed = float(counts.get(k, 0))
        if expected < min_expected:
            pooled_obs += observed
            pooled_exp += expected
        else:
            cells.append((observed, expected))
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    if len(cells) < 2:
        return 1.0
    stat = math.fsum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    half = lambda x: torch.tensor(x / 2, dtype=torch.float64)  # noqa: E731
    return float(torch.special.gammaincc(half(dof), half(stat)))


def hashed_logits_fn(
    width: int,
    *,
    seed: int = 0,
    scale: float = 1.0,
    bias: torch.Tensor | None = None,
    overrides: Mapping[tuple[int, ...], torch.Tensor] | None = None,
) -> LogitsFn:
    """A scripted model: ``scale``·N(0,1) logits seeded by a hash of ``(seed, prefix)``, plus ``bias``.

    Deterministic across runs and platforms (crc32 of the prefix bytes seeds a CPU generator);
    ``overrides[prefix]`` replaces the logits of chosen prefixes. Results are memoised.
    """
    memo: dict[tuple[int, ...], torch.Tensor] = {}
    fixed = {tuple(k): v.detach().float().reshape(-1) for k, v in (overrides or {}).items()}
    extra = None if bias is None else bias.detach().float().reshape(-1)

    def logits_fn(prefix: Sequence[int]) -> torch.Tensor:
        key = tuple(int(t) for t in prefix)
        hit = memo.get(key)
        if hit is None:
            if key in fixed:
                hit = fixed[key]
            else:
                digest = zlib.crc32(np.asarray((seed,) + key, dtype=np.int64).tobytes())
                gen = torch.Generator().manual_seed(digest)
                hit = scale * torch.randn(width, generator=gen)
                if extra is not None:
                    hit = hit + extra
            memo[key] = hit
        return hit.clone()

    return logits_fn


def batched(logits_fn: LogitsFn) -> Callable[[list[list[int]]], torch.Tensor]:
    """A batch logits function (what ``SMC.run`` takes) from a per-prefix one."""

    def batch_fn(prefixes: list[list[int]]) -> torch.Tensor:
        return torch.stack([logits_fn(p).reshape(-1) for p in prefixes])

    return batch_fn


def draw_sequence(
    run,
    logits_fn: LogitsFn,
    matcher,
    *,
    max_tokens: int = 64,
    generator: torch.Generator | None = None,
) -> tuple[list[int], float, int]:
    """Draw with ``run`` (a ``SamplingRun``) until EOS or ``max_tokens``, advancing ``matcher`` in
    place: ``(tokens, summed log_weight, summed checks)``.

    It does not call ``run.finish``: whether a learning sampler (ASAp) learns from the sequence is
    the caller's choice — ``reference_decode`` finishes, a test of a frozen proposal does not.
    """
    tokens: list[int] = []
    log_weight = 0.0
    checks = 0
    while not matcher.is_terminated() and len(tokens) < max_tokens:
        draw = run.draw(logits_fn(tokens), matcher, generator)
        matcher.advance(draw.token)
        tokens.append(draw.token)
        log_weight += draw.log_weight
        checks += draw.checks
    return tokens, log_weight, checks


def reference_decode(
    sampler,
    key: Hashable,
    logits_fn: LogitsFn,
    matcher,
    *,
    max_tokens: int = 64,
    generator: torch.Generator | None = None,
) -> tuple[list[int], float, int]:
    """Generate one sequence with a ``TokenSampler``: ``(tokens, summed log_weight, summed checks)``.

    A minimal loop for tests and benchmarks (``matcher`` is advanced in place): ``start(key)``,
    then ``draw_sequence``, then ``finish``.
    """
    run = sampler.start(key)
    tokens, log_weight, checks = draw_sequence(run, logits_fn, matcher, max_tokens=max_tokens, generator=generator)
    run.finish(tokens, matcher.is_terminated())
    return tokens, log_weight, checks
