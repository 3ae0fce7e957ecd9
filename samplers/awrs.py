"""Adaptive weighted rejection sampling (AWRS; Lipkin et al., COLM 2025, arXiv 2504.05410).

AWRS draws a token from the *locally* constrained distribution ``p(t)·accept(t) / Z`` while asking
the constraint about only a few tokens, and returns an unbiased estimate ``Ẑ`` of the valid mass
``Z = Σ_t p(t)·accept(t)``. Inside SMC (``samplers.smc``) ``Ẑ`` is the incremental importance
weight that turns the locally constrained proposal into a sampler of the *globally* conditioned
model ``P(y | y ∈ L)``.

Adaptive rejection sampling (ARS, the paper's Definition 2): draw a token from ``p``; if the
constraint rejects it, remove it, renormalise and draw again, until a token is accepted. The
accepted token is exactly distributed as ``p·accept / Z`` (rejected tokens carry no accepted mass,
so removing them does not change the conditional). The draws form a *without-replacement* sample
of ``p``: the same order as sorting Gumbel-perturbed log-probabilities (the Gumbel-top-k trick).
We produce that order sequentially, by inverse-CDF draws in which the bins of removed tokens are
skipped (``_Urn``); it is the same distribution, and on a 128K vocabulary it costs one cumulative
sum instead of 128K random numbers and a top-k (measured: 0.16 ms vs 0.9 ms per step on CPU).

Two estimators of ``Z`` are implemented, both *properly weighted*: for every token ``x``,
``E[Ẑ · 1(X = x)] = p(x)·accept(x)``, which implies ``E[Ẑ] = Z`` and is what SMC needs.

``recursive`` (genlm-control's recursive AWRS). Let ``R`` be the tokens rejected before the
first acceptance ``x`` and ``M = Σ_{t∉R} p(t)`` the mass not rejected. Draw one more token ``y``
from ``p`` restricted to ``V ∖ (R ∪ {x})`` and return ``Ẑ = M`` if ``accept(y)`` else
``Ẑ = p(x)`` (``Ẑ = M = p(x)`` when no such ``y`` exists). Unbiasedness, by the recursion
``E f(X) = P(X=x) f(x) + (1 − P(X=x)) E[f(X) | X ≠ x]``: write ``A = Z/M`` for the accepted share
of the not-yet-rejected mass and ``r = p/M``. A rejected draw ``t`` leaves ``Z`` unchanged and
multiplies the remaining mass by ``1 − r(t)``, so by induction the contribution of a rejection is
``r(t)·r(x)/(1−r(t))·(1−r(t)) = r(t) r(x)``, i.e. ``r(x)(1 − A)`` in total. An accepted first draw
``x`` contributes ``r(x)·E[f | x]`` with ``f = A`` needed; the coin ``f = r(x) + (1 − r(x))·1[accept(y)]``
has exactly that mean because ``y`` is accepted with probability ``(A − r(x))/(1 − r(x))``. Sum:
``r(x)A + r(x)(1 − A) = r(x)`` — times ``M`` this is ``p(x)``. ``M·f`` is the returned value.

``two_trace`` (the estimator shipped with the paper, Proposition 3). Run ARS once (trace 0:
``n0`` rejections, rejected mass ``ψ0``), then continue drawing without replacement from the
not-rejected tokens — accepted tokens are never removed, so ``x`` may be drawn again, which costs
no check — until a second acceptance (trace 1: ``n1`` more rejections). Return
``Ẑ = (1 − ψ0)/(n0 + n1 + 1)`` (in mass units: ``(total − ψ0)/(n + 1)``). Unbiasedness: fix the
sequence of rejected tokens ``r_1..r_n`` (``ψ_k`` = mass of the first ``k``). Every draw is from ``p``
restricted to the tokens not yet rejected, so the path "first acceptance ``x`` after ``j`` of the
rejections, second acceptance after all ``n``" has probability
``π(r)·p(x)/(1−ψ_j) · Z/(1−ψ_n)`` with ``π(r) = Π_k p(r_k)/(1−ψ_{k−1})``. Multiplying by
``Ẑ = (1−ψ_j)/(n+1)`` and summing over ``j = 0..n`` gives ``p(x)·π(r)·Z/(1−ψ_n)``, and
``π(r)·Z/(1−ψ_n)`` summed over all reject sequences is the probability that a single ARS run ends,
which is 1. Hence ``E[Ẑ·1(X=x)] = p(x)``. (The same argument shows why adding further traces with
this formula is biased: the sum over ``j`` no longer telescopes.)

``redraw`` (our addition: Russian roulette on the recursive estimator's check). Let ``x`` be the
first acceptance and ``M`` the mass not rejected. Draw once more from the same tokens, ``x``
included: re-drawing ``x`` costs no check and gives ``Ẑ = p(x)``; another token ``y`` is checked
and gives ``Ẑ = p(x) + M·accept(y)``. Proper weighting: an estimator with ``E[Ẑ | history, X = x]
= Z`` for every history of rejections is properly weighted, because ARS ends at ``x`` with
probability ``p(x)/Z`` in total, so ``E[Ẑ·1(X = x)] = Z·p(x)/Z``. Here ``y ≠ x`` with probability
``(M − p(x))/M`` and is then accepted with probability ``(Z − p(x))/(M − p(x))``, so
``E[Ẑ | history, x] = p(x) + M·(Z − p(x))/M = Z``. It costs ``1 − p(x)/M`` checks on average
instead of the recursive estimator's one — little exactly when the model is sure of the token it
drew — and the weights stay bounded and positive (``p(x) <= Ẑ <= p(x) + M <= 2M``); the price is
a larger variance when ``x`` holds most of ``M``, where ``Z`` is known to within ``M − p(x)`` anyway.

Budget (``max_rejects=K`` with an ``allowed`` callback giving the full mask; our addition, with
proof). *recursive* and *redraw*: after ``K`` rejections before any acceptance, compute the mask, return
``Ẑ = Z`` exactly and ``x ~ p·accept/Z`` — the recursion above accepts any properly weighted
estimator of the remaining mass, and the exact one is. *two_trace*: stop when the *total* number
of rejections reaches ``K``. If that happens in trace 0, return the exact ``Z`` and an exact sample
(weight factor ``α = 1``); if it happens in trace 1, return ``x`` with ``Ẑ = 0`` (``β = 0``). With
the sum above restricted to the paths that finish (``n < K``) the shortfall is exactly
``p(x)·P(single ARS run needs ≥ K rejections)``, and the truncated paths of a fixed ``r_1..r_K``
contribute ``π(r)·p(x)·(α + Kβ)``; any ``α + Kβ = 1`` restores unbiasedness. The statistical tests
check both budgets with ``K = 1, 2``.

Pruning (``rejected_with``; our addition). A check says more than "no": a grammar rejects a text
token at the first byte its walk cannot take, and each state the walk went through says which
bytes could follow there; every token spelled with the same first ``d`` bytes and then a byte
that cannot follow is rejected as well, for each ``d`` up to the failure point
(``Matcher.check``). Removing those tokens with the rejected draw costs no check, and every
estimator stays properly weighted: the recursion for *recursive* and *redraw* needs only that
removed tokens are rejected and that each draw comes from ``p`` restricted to what is left, and
in the *two_trace* sum ``ψ_k`` becomes the mass of everything removed after ``k`` rejected draws
(``n`` still counts draws) — each factor ``p(r_k)/(1−ψ_{k−1})`` and the telescoping over ``j``
are unchanged. When the model's favourite spelling is wrong (a property name it does not copy),
one check removes every token that goes wrong along the same walk instead of one draw each: on
MaskBench schemas with the tiny model, ~3 checks per token instead of 31–39 (BENCHMARKS.md §4).

Default: *redraw* — its weights are bounded and positive (``p(x) <= Ẑ <= p(x) + M``; *recursive*:
``<= M``) and its budget exact, as *recursive*'s, and it needs fewer checks: on MaskBench schemas with the tiny model 2.3–2.5
per token against 2.9–3.0 (BENCHMARKS.md §4). The
*two_trace* weights are heavy-tailed when the valid mass is small (values ~``1/n`` with probability
~``Z²``), more so under a budget, and gave visibly noisier SMC posteriors in our tests.
``estimator="auto"`` uses *two_trace* when the largest probability is at least 2/3 and
*recursive* otherwise (genlm-control's ``GEOMETRIC_THRESHOLD``, derived there: a run to two
acceptances of a token of probability ``p`` makes ``1 + 2(1−p)/p`` draws on average, below the 2
checks that *recursive* always makes once ``p > 2/3``; here trace 1 re-draws the already accepted
top token for free). The choice depends only on ``p``, so the mixture stays properly weighted.

Checks a matcher answers from memory are free: ``MatcherChecks`` keeps the tokens a check proved
allowed (the token's byte-prefixes its walk got through alive, ``Matcher.check``) and answers
them without asking again — the same ``accept`` values, so nothing above changes.

The algorithm functions take log-probabilities, an ``accept(token) -> bool`` callback and a
``torch.Generator``; ``AWRS`` adapts them to the ``TokenSampler`` contract with
``matcher.allows`` as ``accept``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Hashable, Literal

import numpy as np
import torch

from samplers._numeric import (
    allowed_mask,
    as_float64,
    cumsum,
    inverse_cdf,
    log_or_neg_inf,
    scores,
    uniforms,
)
from samplers.base import Draw, NoAllowedToken, SamplingParams
from samplers.masked import masked_draw

__all__ = [
    "AWRS",
    "MatcherChecks",
    "AWRSResult",
    "awrs",
    "PEAKED_THRESHOLD",
]

Estimator = Literal["auto", "recursive", "redraw", "two_trace"]
ESTIMATORS: tuple[str, ...] = ("auto", "recursive", "redraw", "two_trace")

#: ``estimator="auto"`` uses ``two_trace`` when the top probability is at least this (see module doc).
PEAKED_THRESHOLD = 2.0 / 3.0

#: ``_Urn`` recomputes its cumulative sum once the mass still drawable falls below this fraction of
#: the mass it was built with: float64 sums over 128K tokens are exact to ~1e-11 of the total, so the
#: remaining bins stay accurate to ~1e-7 relative.
_REBUILD_FRACTION = 1e-4

#: ``_Urn.remove_many`` turns at most this many tokens into gaps; more are zeroed and the cumulative
#: sum rebuilt (one pass over the vocabulary instead of a long gap list every draw walks).
_FEW_REMOVALS = 8


@dataclass(frozen=True)
class AWRSResult:
    """The outcome of one AWRS draw.

    ``token`` is ``None`` when no token with positive probability is accepted (``log_weight`` is
    then ``-inf``). ``log_weight`` is ``log Ẑ``, an estimate of ``log Σ_t exp(logps[t])·accept(t)``
    whose exponential is unbiased; it is ``-inf`` also when a ``two_trace`` run hit its budget in
    trace 1 (``token`` is then a valid sample that carries no weight). ``checks`` counts
    ``accept`` calls, ``rejects`` the distinct rejected tokens, ``used_mask`` whether the budget
    fell back to the full mask, ``log_total`` the log of the total mass of ``logps``.
    """

    token: int | None
    log_weight: float
    checks: int
    rejects: int = 0
    used_mask: bool = False
    #: ``log Σ_t exp(logps[t])``: subtract it from ``log_weight`` for the valid *fraction*.
    log_total: float = 0.0


class _Urn:
    """Tokens drawn from unnormalised weights without replacement of removed ones.

    Inverse-CDF sampling on one float64 cumulative sum; removed tokens become gaps that a uniform
    draw skips (exactly, in O(#removed)), so no draw is wasted. When almost all the mass is
    removed the sum is rebuilt without the removed tokens, keeping the remaining bins accurate.
    """

    __slots__ = ("_wn", "_gen", "_removed", "_pending", "_cdf", "_total", "_gaps", "_gap_mass", "_u")

    def __init__(self, weights: np.ndarray, generator: torch.Generator | None):
        self._wn = weights  # float64, owned (rebuilds zero removed entries in place)
        self._gen = generator
        self._removed = np.zeros(weights.shape[0], dtype=bool)
        self._pending: list[int] = []
        self._u: list[float] = []
        self._build()

    @classmethod
    def from_logps(cls, logps: torch.Tensor, generator: torch.Generator | None) -> tuple["_Urn", float]:
        """An urn over ``exp(logps - shift)`` and the ``shift`` (so masses are ``exp(shift)`` units)."""
        if logps.dim() != 1:
            raise ValueError(f"logps must be 1-D, got shape {tuple(logps.shape)}")
        weights = as_float64(logps)
        if weights.shape[0] == 0:
            return cls(weights, generator), 0.0
        shift = float(weights.max())
        if math.isnan(shift):
            raise ValueError("logps contains NaN")
        if shift == float("inf"):
            raise ValueError("logps contains +inf")
        if shift == float("-inf"):
            return cls(np.zeros_like(weights), generator), 0.0
        np.subtract(weights, shift, out=weights)
        np.exp(weights, out=weights)
        return cls(weights, generator), shift

    def _build(self) -> None:
        if self._pending:
            self._wn[self._pending] = 0.0
            self._pending = []
        self._cdf = cumsum(self._wn)
        self._total = float(self._cdf[-1]) if self._cdf.shape[0] else 0.0
        self._gaps: list[tuple[float, float]] = []
        self._gap_mass = 0.0

    def mass(self) -> float:
        """Weight of the tokens not removed."""
        return max(self._total - self._gap_mass, 0.0)

    def weight(self, token: int) -> float:
        return float(self._wn[token])

    def remove(self, token: int) -> None:
        if self._removed[token]:
            return
        self._removed[token] = True
        self._pending.append(token)
        start = float(self._cdf[token - 1]) if token else 0.0
        width = float(self._cdf[token]) - start
        if width > 0:
            bisect.insort(self._gaps, (start, width))
            self._gap_mass += width
        if self._total > 0 and self.mass() < _REBUILD_FRACTION * self._total:
            self._build()

    def remove_many(self, tokens: np.ndarray) -> None:
        """Remove a set of tokens: a few become gaps, more are zeroed and the sum is rebuilt."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.shape[0] and (tokens.min() < 0 or tokens.max() >= self._removed.shape[0]):
            tokens = tokens[(tokens >= 0) & (tokens < self._removed.shape[0])]
        fresh = tokens[~self._removed[tokens]]  # a set met again (the tokens no byte can start) is free
        if fresh.shape[0] <= _FEW_REMOVALS:
            for token in fresh.tolist():
                self.remove(token)
            return
        self._removed[fresh] = True
        self._wn[fresh] = 0.0
        self._build()

    def _uniform(self) -> float:
        if not self._u:
            self._u = uniforms(8, self._gen).tolist()
        return self._u.pop()

    def draw(self) -> int | None:
        """A token with probability proportional to its weight among those not removed; None if none."""
        n = self._cdf.shape[0]
        for attempt in range(64):
            mass = self.mass()
            if mass <= 0.0:
                return None
            u = self._uniform() * mass
            for start, width in self._gaps:  # ascending: map u onto the kept part of [0, total)
                if u >= start:
                    u += width
                else:
                    break
            token = int(np.searchsorted(self._cdf, u, side="right"))
            if token < n and not self._removed[token] and self._wn[token] > 0:
                return token
            if attempt >= 8:  # rounding keeps landing on a boundary: rebuild without the gaps
                self._build()
        raise RuntimeError("could not draw from the remaining tokens (numerical failure)")  # pragma: no cover


def _exact_tail(
    urn: _Urn, shift: float, allowed: Callable[[], torch.Tensor], checks: int, rejects: int
) -> AWRSResult:
    """Budget fallback: the exact valid mass and an exact sample from the full mask."""
    mask = allowed()
    mask = (mask.detach().to("cpu").numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)).astype(bool)
    mask = mask.reshape(-1)
    n = urn._wn.shape[0]
    keep = np.zeros(n, dtype=bool)
    keep[: min(n, mask.shape[0])] = mask[:n]
    keep &= ~urn._removed  # rejected tokens are not accepted: keep the mask and accept() consistent
    weights = urn._wn * keep
    cdf = cumsum(weights)
    total = float(cdf[-1]) if n else 0.0
    if not total > 0.0:
        return AWRSResult(None, float("-inf"), checks, rejects, used_mask=True)
    token = inverse_cdf(cdf, weights, urn._gen)
    return AWRSResult(token, log_or_neg_inf(total) + shift, checks, rejects, used_mask=True)


def _budget_hit(rejects: int, max_rejects: int | None, allowed) -> bool:
    return max_rejects is not None and allowed is not None and rejects >= max_rejects


def _reject(urn: _Urn, token: int, rejected_with) -> None:
    """Remove a rejected draw, and with it every token the check showed to be rejected too."""
    urn.remove(token)
    if rejected_with is not None:
        others = rejected_with(token)
        if others is not None and len(others) > 1:
            urn.remove_many(others)


def _first_acceptance(urn: _Urn, shift: float, accept, max_rejects, allowed, rejected_with) -> AWRSResult:
    """ARS (trace 0): draw, check, remove the rejected, until a token is accepted. The result's
    ``log_weight`` is ``nan`` for an accepted draw (the estimators fill it in); a budget fallback
    or an urn with nothing left return their final result."""
    checks = rejects = 0
    while True:
        if _budget_hit(rejects, max_rejects, allowed):
            return _exact_tail(urn, shift, allowed, checks, rejects)
        token = urn.draw()
        if token is None:
            return AWRSResult(None, float("-inf"), checks, rejects)
        checks += 1
        if accept(token):
            return AWRSResult(token, float("nan"), checks, rejects)
        rejects += 1
        _reject(urn, token, rejected_with)


def _one_more_draw(urn: _Urn, shift: float, accept, max_rejects, allowed, rejected_with, *, redraw: bool) -> AWRSResult:
    """ARS, then one more draw for the weight: *recursive* (``redraw=False``: from the tokens not
    rejected, the accepted one removed; ``Ẑ = M`` or ``p(x)``) or *redraw* (the accepted one
    kept, re-drawing it costs no check; ``Ẑ = p(x) + M`` or ``p(x)``). See the module docstring."""
    first = _first_acceptance(urn, shift, accept, max_rejects, allowed, rejected_with)
    if first.token is None or first.used_mask:
        return first
    token, checks = first.token, first.checks
    remaining = urn.mass()  # M: mass not rejected, the accepted token included
    p_token = urn.weight(token)
    if not redraw:
        urn.remove(token)
    other = urn.draw()
    if other is None or other == token:  # (None: nothing else left, so M = p(x))
        estimate = p_token if redraw else remaining
    else:
        checks += 1
        accepted = accept(other)
        estimate = (p_token + remaining if accepted else p_token) if redraw else (remaining if accepted else p_token)
    return AWRSResult(token, log_or_neg_inf(estimate) + shift, checks, first.rejects)


_recursive = partial(_one_more_draw, redraw=False)
_redraw = partial(_one_more_draw, redraw=True)


def _two_trace(urn: _Urn, shift: float, accept, max_rejects, allowed, rejected_with) -> AWRSResult:
    first = _first_acceptance(urn, shift, accept, max_rejects, allowed, rejected_with)
    if first.token is None or first.used_mask:
        return first
    token, checks, rejects = first.token, first.checks, first.rejects
    not_rejected = urn.mass()  # (1 - ψ0) in mass units
    while True:  # trace 1: accepted tokens stay in the urn; `token` is known to be accepted
        other = urn.draw()
        if other is None or other == token:  # (None cannot happen: `token` has positive weight)
            break
        checks += 1
        if accept(other):
            break
        rejects += 1
        _reject(urn, other, rejected_with)
        if _budget_hit(rejects, max_rejects, allowed):
            return AWRSResult(token, float("-inf"), checks, rejects)  # β = 0 (module docstring)
    return AWRSResult(token, log_or_neg_inf(not_rejected / (rejects + 1)) + shift, checks, rejects)


def _unknown_estimator(estimator) -> str:
    return f"unknown AWRS estimator {estimator!r}; use one of {', '.join(map(repr, ESTIMATORS))}"


_ALGORITHMS = {"recursive": _recursive, "redraw": _redraw, "two_trace": _two_trace}


def _run(logps, accept, generator, estimator, max_rejects, allowed, rejected_with, weight=True) -> AWRSResult:
    if max_rejects is not None and max_rejects < 1:
        raise ValueError(f"max_rejects must be >= 1 or None, got {max_rejects}")
    if estimator not in ESTIMATORS:
        raise ValueError(_unknown_estimator(estimator))
    algorithm = _ALGORITHMS.get(estimator, _recursive)
    urn, shift = _Urn.from_logps(logps, generator)
    total = urn.mass()
    if not weight:  # the draw alone: ARS, no estimate
        algorithm = _first_acceptance
    elif estimator == "auto":  # the largest weight is exp(0) = 1, so max p = 1 / total
        algorithm = _two_trace if total > 0 and 1.0 / total >= PEAKED_THRESHOLD else _recursive
    result = algorithm(urn, shift, accept, max_rejects, allowed, rejected_with)
    return AWRSResult(
        result.token, result.log_weight, result.checks, result.rejects, result.used_mask, log_or_neg_inf(total) + shift
    )


def awrs(
    logps: torch.Tensor,
    accept: Callable[[int], bool],
    generator: torch.Generator | None = None,
    *,
    estimator: Estimator = "redraw",
    max_rejects: int | None = None,
    allowed: Callable[[], torch.Tensor] | None = None,
    rejected_with: Callable[[int], np.ndarray | None] | None = None,
    weight: bool = True,
) -> AWRSResult:
    """Draw a token ``∝ exp(logps)·accept`` and estimate the valid mass, with the chosen estimator.

    ``estimator``: ``"redraw"`` (default), ``"recursive"`` (ARS until the first acceptance, then
    one more draw for the weight), ``"two_trace"`` (the paper's: ARS plus one continuation trace,
    ``Ẑ = (1 − ψ0)/(n0 + n1 + 1)``; its budget counts the rejections of both traces) or ``"auto"``
    (``two_trace`` when ``max p >= 2/3``, else ``recursive``). Estimators, proofs and budget
    rules: module docstring.

    ``logps``: 1-D log-weights (normalised or not; ``-inf`` entries are never drawn); the result
    estimates ``log Σ_t exp(logps[t])·accept(t)``. ``accept(token)``: the constraint.
    ``max_rejects``/``allowed``: after that many rejections, ``allowed()`` (a bool vector — numpy or
    torch — over the same ids, agreeing with ``accept``) replaces further checks; the rest is exact.
    ``rejected_with(token)``: after ``token`` is rejected, ids of tokens the same check proved
    rejected too (or ``None``); they are removed with it. ``weight=False``: the draw alone (same
    distribution), ``log_weight`` ``nan``: no check is spent on the estimate (the recursive
    estimator's extra draw, the second trace).
    """
    return _run(logps, accept, generator, estimator, max_rejects, allowed, rejected_with, weight)


# --- the TokenSampler adapter ---------------------------------------------------------------


def _mask_fn(matcher, width: int) -> Callable[[], np.ndarray]:
    return lambda: allowed_mask(matcher, width)


@dataclass
class MatcherChecks:
    """``accept`` and ``rejected_with`` callbacks over one matcher state, counting the checks.

    With ``prune``, each check is ``Matcher.check``: a rejection's whole set is handed to AWRS
    through ``rejected_with``, and the tokens a check proved allowed are answered from memory
    afterwards, without a check. Without it (or for a matcher with ``allows`` only), each check
    is ``Matcher.allows``.
    """

    matcher: object
    prune: bool = True
    count: int = 0
    _last: dict = field(default_factory=dict)
    _known_allowed: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.prune = self.prune and hasattr(self.matcher, "check")  # a backend with ``allows`` only

    def accept(self, token: int) -> bool:
        if token in self._known_allowed:
            return True
        self.count += 1
        if not self.prune:
            return self.matcher.allows(token)
        result = self.matcher.check(token)
        self._last.clear()
        if not result.allowed:
            self._last[token] = result.rejected
        self._known_allowed.update(result.accepted.tolist())  # the token itself when allowed
        return result.allowed

    @property
    def rejected_with(self) -> Callable[[int], np.ndarray | None] | None:
        return self._last.get if self.prune else None


class AWRSStats:
    """Counters of one ``AWRS`` sampler, summed over all its runs."""

    draws: int = 0
    checks: int = 0
    mask_fallbacks: int = 0
    zero_weight: int = 0


@dataclass
class _AWRSRun:
    sampler: "AWRS"

    def draw(self, logits: torch.Tensor, matcher, generator: torch.Generator | None) -> Draw:
        if matcher.is_terminated():
            raise NoAllowedToken("the grammar allows no token in this state (EOS was consumed)")
        sampler = self.sampler
        logp = scores(logits, sampler.params)  # log p up to a constant
        checks = MatcherChecks(matcher, sampler.prune)
        result = awrs(
            logp,
            checks.accept,
            generator,
            estimator=sampler.estimator,
            max_rejects=sampler.max_rejects,
            allowed=_mask_fn(matcher, logits.shape[-1]),
            rejected_with=checks.rejected_with,
            weight=sampler.weight,
        )
        stats = sampler.stats
        stats.draws += 1
        stats.checks += checks.count
        stats.mask_fallbacks += int(result.used_mask)
        if result.token is None:
            # The processed distribution gives no allowed token positive probability (top-k/top-p
            # or temperature 0 removed them all): the target is zero here. Fall back to masked
            # sampling so the sequence can go on, and say so with a zero weight.
            stats.zero_weight += 1
            token = masked_draw(logits, matcher, sampler.params, generator)
            return Draw(token=token, log_weight=float("-inf"), checks=checks.count)
        if result.log_weight == float("-inf"):
            stats.zero_weight += 1
        log_weight = result.log_weight - result.log_total  # the valid *probability* mass
        return Draw(token=result.token, log_weight=log_weight, checks=checks.count)

    def finish(self, tokens: list[int], completed: bool) -> None:
        return None


@dataclass
class AWRS:
    """Adaptive weighted rejection sampling as a ``TokenSampler`` (see the module docstring).

    Each ``draw`` samples exactly from the locally constrained distribution (the model's
    distribution after ``process_logits`` on the *unmasked* logits, restricted to the tokens
    ``matcher.allows``), testing only the tokens it draws. ``Draw.log_weight`` is the log of an
    unbiased estimate of the allowed probability mass (the SMC incremental weight), ``Draw.checks``
    the number of ``matcher.allows`` calls (the full-mask fallback is counted in ``stats``).

    ``estimator``: ``"redraw"`` (default), ``"recursive"``, ``"two_trace"`` or ``"auto"``. ``max_rejects``: after that
    many rejections the full mask is computed and the rest is exact (``None``: never). ``prune``:
    a rejection also removes every token that fails along the same walk, and tokens a check
    proved allowed are not asked again (``Matcher.check``; exact, see the module docstring);
    ``False`` asks ``allows`` only.
    ``weight=False``: draws only, ``Draw.log_weight`` is ``nan`` — up to one check fewer per token
    (the estimate's extra draw) for users who sample and never reweight; SMC needs the weights.
    EOS is a token like the others: ``allows(eos)`` holds iff the matcher is accepting. When no
    allowed token has positive probability the draw falls back to masked sampling with
    ``log_weight = -inf``. Stateless across sequences except for the ``stats`` counters.
    """

    params: SamplingParams = field(default_factory=SamplingParams)
    estimator: Estimator = "redraw"
    max_rejects: int | None = 64
    prune: bool = True
    weight: bool = True
    stats: AWRSStats = field(default_factory=AWRSStats, compare=False)

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(_unknown_estimator(self.estimator))
        if self.max_rejects is not None and self.max_rejects < 1:
            raise ValueError(f"max_rejects must be >= 1 or None, got {self.max_rejects}")

    def start(self, key: Hashable = None) -> _AWRSRun:
        """A run for one sequence (AWRS keeps no per-sequence state; ``key`` is ignored)."""
        return _AWRSRun(self)
