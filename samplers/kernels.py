"""Applying packed token bitmasks to logits (torch). The one place masks meet tensors.

Lives in ``samplers`` (not ``engine``) because every sampler needs it and the layering is
grammars <- samplers <- engine.
"""

from __future__ import annotations

import torch

__all__ = ["apply_token_bitmask_inplace", "bitmask_to_bool"]

_BIT = torch.arange(32, dtype=torch.int32)


def bitmask_to_bool(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """Unpack int32 words ``[..., ceil(width/32)]`` into a bool tensor ``[..., width]`` (True = allowed)."""
    bits = (bitmask.unsqueeze(-1) >> _BIT.to(bitmask.device)) & 1
    return bits.reshape(*bitmask.shape[:-1], -1)[..., :width].bool()


def apply_token_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None) -> None:
    """Set disallowed logits to ``-inf`` in place.

    Reference semantics::

        for row in (indices if indices is not None else range(logits.shape[0])):
            for token in range(logits.shape[-1]):
                allowed = token < 32 * bitmask.shape[-1] and (bitmask[row, token // 32] >> (token % 32)) & 1
                if not allowed:
                    logits[row, token] = -inf

    ``logits`` is ``[batch, width]`` or ``[width]`` (float, any device); ``bitmask`` is int32
    ``[batch, words]`` or ``[words]`` on CPU or the logits' device (it is moved if needed). Logits
    wider than the mask (padded vocabulary) are masked out: ids beyond the mask are never allowed.
    """
    if logits.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"logits must be a floating tensor, got {logits.dtype}")
    if bitmask.dtype != torch.int32:
        raise TypeError(f"bitmask must be int32 (see grammars.allocate_token_bitmask), got {bitmask.dtype}")
    squeeze = logits.dim() == 1
    rows = logits.unsqueeze(0) if squeeze else logits
    mask = bitmask.unsqueeze(0) if bitmask.dim() == 1 else bitmask
    if mask.shape[0] != rows.shape[0]:
        raise ValueError(f"bitmask has {mask.shape[0]} rows but logits have {rows.shape[0]}")
    mask = mask.to(rows.device)
    width = rows.shape[-1]
    covered = min(width, 32 * mask.shape[-1])
    allowed = torch.zeros((mask.shape[0], width), dtype=torch.bool, device=rows.device)
    allowed[:, :covered] = bitmask_to_bool(mask, covered)
    if indices is None:
        rows.masked_fill_(~allowed, float("-inf"))
    else:
        index = indices.to(rows.device)
        rows[index] = rows[index].masked_fill(~allowed[index], float("-inf"))
