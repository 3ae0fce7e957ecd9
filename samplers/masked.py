"""Grammar-constrained decoding baseline: mask, renormalise, sample.

This samples the *locally* constrained distribution (every step renormalised over the allowed
tokens), which is not the model's distribution conditioned on the grammar — see ``asap`` and
``awrs``/``smc`` for samplers that correct it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

import torch

from grammars import allocate_token_bitmask
from samplers.base import Draw, NoAllowedToken, SamplingParams
from samplers.kernels import apply_token_bitmask_inplace

__all__ = ["MaskedSampler", "masked_distribution", "process_logits"]


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


def masked_distribution(logits: torch.Tensor, matcher, params: SamplingParams = SamplingParams()) -> torch.Tensor:
    """Probabilities over the logits width: the grammar mask applied, then ``process_logits``."""
    words = allocate_token_bitmask(1, logits.shape[-1])
    matcher.fill_mask(words, 0)
    masked = logits.detach().float().clone()
    apply_token_bitmask_inplace(masked, torch.from_numpy(words[0]))
    if torch.isneginf(masked).all():
        raise NoAllowedToken("the grammar allows no token in this state")
    return torch.softmax(process_logits(masked, params), dim=-1)


@dataclass
class _MaskedRun:
    params: SamplingParams

    def draw(self, logits: torch.Tensor, matcher, generator: torch.Generator | None) -> Draw:
        probs = masked_distribution(logits, matcher, self.params)
        token = int(torch.multinomial(probs, 1, generator=generator).item())
        return Draw(token=token)

    def finish(self, tokens: list[int], completed: bool) -> None:
        return None


@dataclass
class MaskedSampler:
    """The GCD baseline as a ``TokenSampler``. Stateless across sequences."""

    params: SamplingParams = field(default_factory=SamplingParams)

    def start(self, key: Hashable = None) -> _MaskedRun:
        return _MaskedRun(self.params)

