"""corral.samplers — HOW TO DRAW: token samplers over logits and a grammar Matcher.

The decoding loop (``engine``) calls ``sampler.start(key)`` per sequence, then ``run.draw(logits,
matcher, generator)`` per step; see ``samplers.base`` for the contract. ``MaskedSampler`` (GCD),
``ASAp`` (grammar-aligned, learns across sequences of one key) and ``AWRS`` (exact local samples
with importance weights) are ``TokenSampler``s; ``SMC`` is a sequence-level sampler a decoder
calls through ``SMC.run(batch_logits_fn, matcher, max_tokens=...)``. The algorithms themselves are
pure functions in ``samplers.asap``, ``samplers.awrs`` and ``samplers.smc``; exact enumeration
over small grammars (the tests' ground truth) is in ``samplers.enumerate``. For diffusion LMs under a
regular constraint, ``dingo_map``/``dingo_sample`` (``samplers.dingo``) give the best or an exactly
sampled block over a ``grammars.TokenDFA``, raising ``NoValidBlock`` when none is valid.
"""

from samplers.asap import ASAp
from samplers.awrs import AWRS
from samplers._numeric import sample_categorical
from samplers.base import Draw, NoAllowedToken, SamplingParams, SamplingRun, TokenSampler
from samplers.dingo import NoValidBlock, dingo_map, dingo_sample
from samplers.kernels import apply_token_bitmask_inplace
from samplers.masked import MaskedSampler
from samplers.smc import SMC, SMCResult

__all__ = [
    "sample_categorical",
    "SamplingParams",
    "Draw",
    "SamplingRun",
    "TokenSampler",
    "NoAllowedToken",
    "MaskedSampler",
    "apply_token_bitmask_inplace",
    "ASAp",
    "AWRS",
    "SMC",
    "SMCResult",
    "dingo_map",
    "dingo_sample",
    "NoValidBlock",
]
