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
from samplers._numeric import sample_categorical
from samplers.base import Draw, NoAllowedToken, SamplingParams, process_logits
from samplers.kernels import apply_token_bitmask_inplace

__all__ = ["MaskedSampler", "masked_distribution"]


def masked_distribution(logits: torch.Tensor, matcher, params: SamplingParams = SamplingParams()) -> torch.Tensor:
    """Probabilities over the logits width: the grammar mask applied, then ``process_logits``."""
    words = allocate_token_bitmask(1, logits.shape[-1])
    matcher.fill_mask(words, 0)
    masked = logits.detach().float().clone()
    apply_token_bitmask_inplace(masked, words[0])
    if torch.isneginf(masked).all():
        raise NoAllowedToken("the grammar allows no token in this state")
    return torch.softmax(process_logits(masked, params), dim=-1)


@dataclass
class _MaskedRun:
    params: SamplingParams

    def draw(self, logits: torch.Tensor, matcher, generator: torch.Generator | None) -> Draw:
        probs = masked_distribution(logits, matcher, self.params)
        token = sample_categorical(probs, generator)  # torch.multinomial took ~8 ms at 128k
        return Draw(token=token)

    def finish(self, tokens: list[int], completed: bool) -> None:
        return None


@dataclass
class MaskedSampler:
    """The GCD baseline as a ``TokenSampler``. Stateless across sequences."""

    params: SamplingParams = field(default_factory=SamplingParams)

    def start(self, key: Hashable = None) -> _MaskedRun:
        return _MaskedRun(self.params)

