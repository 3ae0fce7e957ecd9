"""Numeric helpers every sampler shares: fast categorical draws, masks as vectors, logit scores.

One implementation each; ``awrs``, ``asap``, ``smc`` and ``masked`` import from here.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from grammars.bitmask import allocate_token_bitmask, unpack_bits
from samplers.base import SamplingParams, process_logits

__all__ = ["uniforms", "as_float64", "log_or_neg_inf", "cumsum", "inverse_cdf", "sample_categorical",
           "allowed_mask", "scores"]


def uniforms(n: int, generator: torch.Generator | None) -> np.ndarray:
    """``n`` float64 uniforms in [0, 1) from ``generator`` on its own device (the engine passes a
    CUDA generator when the logits live on a GPU; ``torch.rand`` on CPU would reject it)."""
    device = generator.device if generator is not None else "cpu"
    return torch.rand(n, dtype=torch.float64, generator=generator, device=device).cpu().numpy()


def as_float64(values: torch.Tensor) -> np.ndarray:
    """A fresh float64 numpy copy of a 1-D tensor (numpy's exp/cumsum beat torch's at both 10 and 128K)."""
    t = values.detach().to("cpu")
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    return t.numpy().astype(np.float64)  # astype copies


def log_or_neg_inf(x: float) -> float:
    return math.log(x) if x > 0 else float("-inf")


def cumsum(weights: np.ndarray) -> np.ndarray:
    """float64 cumulative sum (torch's is ~5x faster than numpy's on 128K; numpy wins when tiny)."""
    if weights.shape[0] <= 4096:
        return np.cumsum(weights, dtype=np.float64)
    return torch.cumsum(torch.from_numpy(np.ascontiguousarray(weights, dtype=np.float64)), 0).numpy()


def inverse_cdf(cdf: np.ndarray, weights: np.ndarray, generator: torch.Generator | None) -> int:
    total = float(cdf[-1])
    for _ in range(16):
        u = float(uniforms(1, generator)[0]) * total
        token = int(np.searchsorted(cdf, u, side="right"))
        if token < cdf.shape[0] and weights[token] > 0:
            return token
    return int(np.argmax(weights))  # pragma: no cover - only on pathological rounding


def _sample_weights(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    w = weights.detach().to(device="cpu", dtype=torch.float64).numpy()
    if w.shape[0] == 0 or not np.all(w >= 0):
        raise ValueError("weights must be non-negative and not empty")
    cdf = cumsum(w)
    if not float(cdf[-1]) > 0:
        raise ValueError("cannot sample: all weights are zero")
    return inverse_cdf(cdf, w, generator)


def sample_categorical(weights: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One index drawn with probability proportional to the non-negative 1-D ``weights``.

    Inverse-CDF over a float64 cumulative sum: ~0.3 ms on 128K CPU logits, where
    ``torch.multinomial`` took ~8 ms in our measurements. Raises ``ValueError`` if every weight is
    zero or one is negative.
    """
    if weights.dim() != 1:
        raise ValueError(f"weights must be 1-D, got shape {tuple(weights.shape)}")
    return _sample_weights(weights.detach().cpu(), generator)


def allowed_mask(matcher, width: int) -> np.ndarray:
    """``matcher``'s allowed tokens as a bool numpy vector of length ``width`` (one ``fill_mask``).

    Unpacks the packed int32 words with ``np.unpackbits`` (~10 µs for 128K ids, vs ~120 µs for a
    torch shift-and-mask).
    """
    words = allocate_token_bitmask(1, width)
    matcher.fill_mask(words, 0)
    return unpack_bits(words[0], width)


def scores(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``process_logits`` on 1-D logits, skipped when ``params`` changes nothing."""
    flat = logits.detach().reshape(-1)
    if params.temperature == 1.0 and params.top_k == 0 and params.top_p == 1.0:
        return flat
    return process_logits(flat, params)
