"""Sequential Monte Carlo with AWRS proposals (Lipkin et al., COLM 2025, §3; genlm-control's ``SMC``).

Target: the model conditioned on the grammar, ``Q(y) = P(y)·1[y ∈ L] / Z``. Each particle is a
token prefix with a forked ``Matcher`` and a log weight. At every step each live particle draws
its next token with AWRS — exactly from the locally constrained distribution ``q(t | w)`` — and
multiplies its weight by AWRS's unbiased estimate ``Ẑ_w`` of the allowed mass
``Z_w = Σ_t P(t | w)·m_w(t)``. Since ``P(t | w) = Z_w · q(t | w)`` on allowed tokens, the weight of
a complete sequence is an unbiased estimate of ``P(y) / q_GCD(y)``: the particles are properly
weighted for ``Q`` and the myopia of masking is corrected, with only a few ``allows`` checks per
token instead of a full mask.

When the effective sample size ``ESS = (Σw)² / Σw²`` falls below ``ess_threshold · N``, particles
are resampled (``"multinomial"`` or ``"systematic"``) and every weight is set to the mean weight,
so that ``mean(final weights)`` stays an unbiased estimate of ``Z`` (``SMCResult.log_ml``) — the
resampling decision only depends on the current weights, which keeps that property. Finished
particles keep their weights and take part in resampling. The run stops when every particle has
emitted EOS or died (zero weight), or after ``max_tokens`` steps; particles cut by the budget are
*incomplete* and get no mass in the posterior.

``SMC`` is not a ``TokenSampler``: a decoder (``engine``) calls ``SMC(...).run(logits_fn, matcher,
max_tokens=..., generator=...)`` with a *batch* logits callback, ``logits_fn(prefixes) ->
[len(prefixes), width]`` next-token logits for each particle's generated prefix (the prompt is the
callback's business), and then uses ``SMCResult.sample()`` or ``posterior()``.

Budget-aware closing: the engine passes the start matcher narrowed by the closing condition
(``samplers.narrowing.NarrowedMatcher``), so each particle's AWRS proposal only draws tokens after
which the text can still be finished within ``max_tokens`` and every particle completes in time;
the target becomes ``P(y)·1[y ∈ L_B]`` (``L_B``: the texts the narrowing lets through), and the
weights stay properly weighted for it, since AWRS treats the narrowing as part of the constraint.

``temperature=0``: the processed model is a point mass on the unconstrained argmax, so the
grammar-conditioned target is undefined (zero mass) wherever that token is not allowed. As the
other samplers do, SMC then decodes greedily under the constraint — the most likely allowed
token at every step, one sequence that every particle shares — and reports ``log_ml = nan``
(no estimate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
import torch

from samplers._numeric import allowed_mask, scores, uniforms
from samplers.awrs import Estimator, MatcherChecks, awrs
from samplers.base import SamplingParams
from samplers.masked import masked_draw

__all__ = ["SMC", "SMCResult", "effective_sample_size", "resample"]

BatchLogitsFn = Callable[[list[list[int]]], torch.Tensor]


def _logsumexp(values: np.ndarray) -> float:
    if values.size == 0:
        return float("-inf")
    top = float(np.max(values))
    if top == float("-inf"):
        return top
    return top + math.log(float(np.sum(np.exp(values - top))))


def effective_sample_size(log_weights: np.ndarray) -> float:
    """``(Σ w)² / Σ w²`` of ``w = exp(log_weights)`` (0 when every weight is 0)."""
    lw = np.asarray(log_weights, dtype=np.float64)
    total = _logsumexp(lw)
    if total == float("-inf"):
        return 0.0
    return math.exp(2 * total - _logsumexp(2 * lw))


def resample(
    log_weights: np.ndarray,
    n: int,
    method: Literal["multinomial", "systematic"] = "multinomial",
    generator: torch.Generator | None = None,
) -> np.ndarray:
    """``n`` ancestor indices drawn in proportion to ``exp(log_weights)``.

    ``multinomial``: i.i.d. draws. ``systematic``: one uniform ``u``, points ``(u + k)/n``; lower
    variance, still unbiased (each index appears ``n·w_i`` times in expectation).
    """
    lw = np.asarray(log_weights, dtype=np.float64)
    total = _logsumexp(lw)
    if total == float("-inf"):
        raise ValueError("cannot resample: every weight is zero")
    positive = np.flatnonzero(lw > float("-inf"))
    cdf = np.cumsum(np.exp(lw[positive] - total))
    cdf[-1] = 1.0  # absorb rounding: points are < 1, so the last positive particle closes the range
    if method == "multinomial":
        points = uniforms(n, generator)
    elif method == "systematic":
        u = float(uniforms(1, generator)[0])
        points = (u + np.arange(n)) / n
    else:
        raise ValueError(f"unknown resampling method {method!r}; use 'multinomial' or 'systematic'")
    return positive[np.minimum(np.searchsorted(cdf, points, side="right"), len(positive) - 1)]


@dataclass(frozen=True)
class SMCResult:
    """Weighted particles from ``SMC.run``.

    ``tokens[i]``: particle ``i``'s generated ids (ending with EOS when ``completed[i]``);
    ``log_weights[i]``: its final log weight (``-inf`` for dead particles); ``log_ml``: log of the
    unbiased estimate of ``Z = P(y ∈ L, |y| <= max_tokens)`` (mean weight of the completed
    particles); ``resampled``: steps at which resampling happened; ``checks``: ``allows`` calls;
    ``steps``: decoding steps taken.
    """

    tokens: tuple[tuple[int, ...], ...]
    log_weights: np.ndarray
    completed: np.ndarray
    log_ml: float
    resampled: tuple[int, ...] = ()
    checks: int = 0
    steps: int = 0
    ess_history: tuple[float, ...] = field(default=(), repr=False)

    def normalized_weights(self) -> np.ndarray:
        """Weights of the particles, normalised over the *completed* ones (zeros elsewhere)."""
        lw = np.where(self.completed, self.log_weights, -np.inf)
        total = _logsumexp(lw)
        if total == float("-inf"):
            return np.zeros(len(lw))
        return np.exp(lw - total)

    def posterior(self) -> dict[tuple[int, ...], float]:
        """The weighted estimate of ``Q``: normalised weight per distinct complete sequence."""
        out: dict[tuple[int, ...], float] = {}
        for seq, w in zip(self.tokens, self.normalized_weights()):
            if w > 0:
                out[seq] = out.get(seq, 0.0) + float(w)
        return out

    def estimate(self, f: Callable[[tuple[int, ...]], float]) -> float:
        """Self-normalised estimate of ``E_Q[f(y)]`` (NaN if no particle completed with weight)."""
        w = self.normalized_weights()
        if not w.any():
            return float("nan")
        return float(sum(wi * f(seq) for seq, wi in zip(self.tokens, w) if wi > 0))

    def sample(self, generator: torch.Generator | None = None) -> tuple[int, ...]:
        """One complete sequence drawn in proportion to the weights (``ValueError`` if none)."""
        lw = np.where(self.completed, self.log_weights, -np.inf)
        if _logsumexp(lw) == float("-inf"):
            raise ValueError("no complete particle with positive weight to sample from")
        return self.tokens[int(resample(lw, 1, "multinomial", generator)[0])]

    @property
    def ess(self) -> float:
        """Effective sample size of the completed particles' final weights."""
        return effective_sample_size(np.where(self.completed, self.log_weights, -np.inf))


class _Particle:
    __slots__ = ("tokens", "matcher", "log_weight", "done", "completed")

    def __init__(self, tokens: list[int], matcher, log_weight: float, done: bool = False, completed: bool = False):
        self.tokens = tokens
        self.matcher = matcher
        self.log_weight = log_weight
        self.done = done
        self.completed = completed

    def copy(self, log_weight: float) -> "_Particle":
        return _Particle(list(self.tokens), self.matcher.fork(), log_weight, self.done, self.completed)


@dataclass
class SMC:
    """SMC over ``particles`` forked matchers with AWRS proposals (see the module docstring).

    ``ess_threshold``: resample when ``ESS < ess_threshold · particles`` (0 never, 1 every step);
    ``resampling``: ``"multinomial"`` or ``"systematic"``; ``params``: ``process_logits`` settings
    defining the model; ``estimator``/``max_rejects``/``prune``: passed to AWRS. Call ``run``.
    """

    particles: int = 8
    ess_threshold: float = 0.5
    resampling: Literal["multinomial", "systematic"] = "multinomial"
    params: SamplingParams = field(default_factory=SamplingParams)
    estimator: Estimator = "redraw"
    max_rejects: int | None = 64
    prune: bool = True

    def __post_init__(self) -> None:
        if self.particles < 1:
            raise ValueError(f"particles must be >= 1, got {self.particles}")
        if not 0.0 <= self.ess_threshold <= 1.0:
            raise ValueError(f"ess_threshold must be in [0, 1], got {self.ess_threshold}")
        if self.resampling not in ("multinomial", "systematic"):
            raise ValueError(f"unknown resampling method {self.resampling!r}; use 'multinomial' or 'systematic'")

    def run(
        self,
        logits_fn: BatchLogitsFn,
        matcher,
        *,
        max_tokens: int,
        generator: torch.Generator | None = None,
    ) -> SMCResult:
        """Run SMC from ``matcher``'s state (not modified) for at most ``max_tokens`` steps.

        ``temperature=0`` decodes greedily instead (module docstring).
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if self.params.temperature == 0:
            return self._greedy(logits_fn, matcher, max_tokens, generator)
        n = self.particles
        particles = [_Particle([], matcher.fork(), 0.0) for _ in range(n)]
        for p in particles:
            if p.matcher.is_terminated():
                p.done, p.completed = True, True
        resampled: list[int] = []
        ess_history: list[float] = []
        checks = 0
        steps = 0
        while steps < max_tokens and any(not p.done for p in particles):
            live = [p for p in particles if not p.done]
            logits = logits_fn([p.tokens for p in live])
            if logits.dim() != 2 or logits.shape[0] != len(live):
                raise ValueError(
                    f"logits_fn returned shape {tuple(logits.shape)} for {len(live)} prefixes; "
                    "expected [len(prefixes), width]"
                )
            for p, row in zip(live, logits):
                checks += self._extend(p, row, generator)
            steps += 1
            log_weights = np.array([p.log_weight for p in particles])
            ess = effective_sample_size(log_weights)
            ess_history.append(ess)
            if ess == 0.0:
                break  # every particle died
            if ess < self.ess_threshold * n and any(not p.done for p in particles):
                ancestors = resample(log_weights, n, self.resampling, generator)
                mean = _logsumexp(log_weights) - math.log(n)
                particles = [particles[int(a)].copy(mean) for a in ancestors]
                resampled.append(steps)
        completed = np.array([p.completed for p in particles], dtype=bool)
        log_weights = np.array([p.log_weight for p in particles], dtype=np.float64)
        log_ml = _logsumexp(np.where(completed, log_weights, -np.inf)) - math.log(n)
        return SMCResult(
            tokens=tuple(tuple(p.tokens) for p in particles),
            log_weights=log_weights,
            completed=completed,
            log_ml=log_ml,
            resampled=tuple(resampled),
            checks=checks,
            steps=steps,
            ess_history=tuple(ess_history),
        )

    def _greedy(self, logits_fn: BatchLogitsFn, matcher, max_tokens: int, generator) -> SMCResult:
        """Greedy constrained decoding, the ``temperature=0`` case: one sequence for every particle."""
        m = matcher.fork()
        tokens: list[int] = []
        while len(tokens) < max_tokens and not m.is_terminated():
            logits = logits_fn([tokens])
            if logits.dim() != 2 or logits.shape[0] != 1:
                raise ValueError(f"logits_fn returned shape {tuple(logits.shape)} for 1 prefix; expected [1, width]")
            token = masked_draw(logits[0], m, self.params, generator)
            m.advance(token)
            tokens.append(token)
        n = self.particles
        done = m.is_terminated()
        return SMCResult(
            tokens=(tuple(tokens),) * n,
            log_weights=np.zeros(n, dtype=np.float64),
            completed=np.full(n, done, dtype=bool),
            log_ml=float("nan"),
            steps=len(tokens),
        )

    def _extend(self, particle: _Particle, logits: torch.Tensor, generator) -> int:
        m = particle.matcher
        width = logits.shape[-1]
        checks = MatcherChecks(m, self.prune)
        result = awrs(
            scores(logits, self.params),
            checks.accept,
            generator,
            estimator=self.estimator,
            max_rejects=self.max_rejects,
            allowed=lambda: allowed_mask(m, width),
            rejected_with=checks.rejected_with,
        )
        if result.token is None or result.log_weight == float("-inf"):
            particle.log_weight = float("-inf")
            particle.done = True
            return checks.count
        m.advance(result.token)
        particle.tokens.append(result.token)
        particle.log_weight += result.log_weight - result.log_total
        if m.is_terminated():
            particle.done = particle.completed = True
        return checks.count
