"""Grammar-constrained decoding baseline: mask, renormalise, sample.

This samples the *locally* constrained distribution (every step renormalised over the allowed
tokens), which is not the model's distribution conditioned on the grammar — see ``asap`` and
``awrs``/``smc`` for samplers that correct it.

``masked_draw`` is that draw for any matcher. For a ``NarrowedMatcher`` (budget-aware closing) it
draws from the base mask and asks the narrowing about the drawn token only, removing refused
tokens and drawing again — the same distribution over the admitted tokens (temperature, top-k and
top-p applied to what is left, as for any mask) — and falls back to the exact narrowed mask after
``lazy_checks`` refusals, so the draw stays exact however little of the mass is admitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

import torch

from grammars import allocate_token_bitmask
from samplers._numeric import sample_categorical
from samplers.base import Draw, NoAllowedToken, SamplingParams, process_logits
from samplers.kernels import apply_token_bitmask_inplace, disallow_tokens_inplace
from samplers.narrowing import NarrowedMatcher

__all__ = ["MaskedSampler", "masked_distribution", "masked_draw"]


def masked_distribution(logits: torch.Tensor, matcher, params: SamplingParams = SamplingParams()) -> torch.Tensor:
    """Probabilities over the logits width: the grammar mask applied, then ``process_logits``."""
    words = allocate_token_bitmask(1, logits.shape[-1])
    matcher.fill_mask(words, 0)
    masked = logits.detach().float().clone()
    apply_token_bitmask_inplace(masked, words[0])
    if torch.isneginf(masked).all():
        raise NoAllowedToken("the grammar allows no token in this state")
    return torch.softmax(process_logits(masked, params), dim=-1)


def masked_draw(logits: torch.Tensor, matcher, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from ``masked_distribution(logits, matcher, params)``; lazily for a narrowed matcher."""
    if not isinstance(matcher, NarrowedMatcher):
        return sample_categorical(masked_distribution(logits, matcher, params), generator)
    words = allocate_token_bitmask(1, logits.shape[-1])
    matcher.base.fill_mask(words, 0)
    masked = logits.detach().float().clone()
    apply_token_bitmask_inplace(masked, words[0])
    for _ in range(matcher.lazy_checks):
        if torch.isneginf(masked).all():
            break
        token = sample_categorical(torch.softmax(process_logits(masked, params), dim=-1), generator)
        if matcher.admits(token):
            return token
        disallow_tokens_inplace(masked, token)  # refused: drawing again renormalises over the rest
    matcher.fill_mask(words, 0)  # many refusals: the exact narrowed mask, one check per allowed token
    apply_token_bitmask_inplace(masked, words[0])
    if torch.isneginf(masked).all():
        raise NoAllowedToken("no token is allowed here once the matcher's narrowing is applied")
    return sample_categorical(torch.softmax(process_logits(masked, params), dim=-1), generator)


@dataclass
class _MaskedRun:
    params: SamplingParams

    def draw(self, logits: torch.Tensor, matcher, generator: torch.Generator | None) -> Draw:
        """A token from the masked, processed distribution (``sample_categorical``: torch.multinomial
        took ~8 ms at 128k)."""
        return Draw(token=masked_draw(logits, matcher, self.params, generator))

    def finish(self, tokens: list[int], completed: bool) -> None:
        """Nothing to learn: the masked sampler is stateless."""
        return None


@dataclass
class MaskedSampler:
    """The GCD baseline as a ``TokenSampler``. Stateless across sequences."""

    params: SamplingParams = field(default_factory=SamplingParams)

    def start(self, key: Hashable = None) -> _MaskedRun:
        """A run for one sequence (``key`` is ignored: nothing is learnt across sequences)."""
        return _MaskedRun(self.params)

