"""The contract between decoding loops (``engine``) and token samplers.

A ``TokenSampler`` is long-lived (it may learn across draws, like ASAp); for each generated
sequence the loop calls ``start(key)`` and gets a ``SamplingRun``, then per step
``run.draw(logits, matcher, generator)`` and finally ``run.finish(...)``. The loop owns the
matcher: ``draw`` may read it (``fill_mask``, ``allows``, ``fork``) but never advances it. Under
budget-aware closing the matcher is a ``samplers.narrowing.NarrowedMatcher`` — the same contract,
for the constraint narrowed to the tokens that still close in time — and the loop takes the drawn
token as it is: a sampler's draw is never overridden.

Errors: ``draw`` raises ``NoAllowedToken`` when the grammar allows nothing (a terminated
matcher) — a misuse by the loop, which must stop at EOS. Samplers are not thread-safe; use one
per thread.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Hashable, Protocol, runtime_checkable

import torch

from grammars.errors import NoAllowedToken  # re-exported: samplers raise it

__all__ = ["SamplingParams", "Draw", "SamplingRun", "TokenSampler", "NoAllowedToken", "process_logits"]


@dataclass(frozen=True)
class SamplingParams:
    """Logit processing applied before masking-aware sampling, in this order: temperature, top-k,
    top-p (nucleus, over the *allowed* tokens). ``temperature=0`` means greedy."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
            raise TypeError(f"top_k must be an int, got {type(self.top_k).__name__} {self.top_k!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:  # (NaN fails this too)
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p on (already masked) logits; returns new logits.

    ``-inf`` entries stay ``-inf``; top-k/top-p never remove the most likely allowed token, so a
    non-empty mask stays non-empty. Temperature 0 keeps only the argmax.
    """
    out = logits.float()
    if params.temperature == 0:
        best = torch.argmax(out)
        greedy = torch.full_like(out, float("-inf"))
        greedy[best] = 0.0
        return greedy
    if params.temperature != 1.0:
        out = out / params.temperature
    if params.top_k and params.top_k < out.shape[-1]:
        kth = torch.topk(out, params.top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        cumulative = torch.cumsum(probs, dim=-1)
        drop_sorted = cumulative - probs >= params.top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted)
        drop[order] = drop_sorted
        out = out.masked_fill(drop, float("-inf"))
    return out


@dataclass(frozen=True)
class Draw:
    """One sampled token, the log importance weight it contributes (0 for samplers that are exact
    for their target), and how many single-token grammar checks it cost."""

    token: int
    log_weight: float = 0.0
    checks: int = 0


@runtime_checkable
class SamplingRun(Protocol):
    """Sampling state for one sequence (created by ``TokenSampler.start``)."""

    def draw(self, logits: torch.Tensor, matcher, generator: torch.Generator | None) -> Draw:
        """Pick the next token from 1-D ``logits`` (width = logits width) given ``matcher``'s state."""
        ...

    def finish(self, tokens: list[int], completed: bool) -> None:
        """The sequence ended: ``completed`` means it reached an accepting state (EOS)."""
        ...


@runtime_checkable
class TokenSampler(Protocol):
    """A sampler: ``MaskedSampler``, ``ASAp``, ``AWRS`` — anything with ``start(key) -> SamplingRun``."""

    def start(self, key: Hashable) -> SamplingRun:
        """A run for one sequence; ``key`` identifies (prompt, grammar) for samplers that learn."""
        ...
