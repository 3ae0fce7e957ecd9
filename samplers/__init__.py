"""corral.samplers — HOW TO DRAW: token samplers over logits and a grammar Matcher.

The decoding loop (``engine``) calls ``sampler.start(key)`` per sequence, then ``run.draw(logits,
matcher, generator)`` per step; see ``samplers.base`` for the contract.
"""

from samplers.base import Draw, NoAllowedToken, SamplingParams, SamplingRun, TokenSampler
from samplers.kernels import apply_token_bitmask_inplace
from samplers.masked import MaskedSampler

__all__ = [
    "SamplingParams",
    "Draw",
    "SamplingRun",
    "TokenSampler",
    "NoAllowedToken",
    "MaskedSampler",
    "apply_token_bitmask_inplace",
]
