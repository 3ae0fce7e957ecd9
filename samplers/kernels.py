"""Masking logits: the one place where ``-inf`` is written into logits for tokens that may not come.

Every caller goes through here — the engine's decoding loop (grammar masks, padding columns, EOS
under ``ignore_eos``), ``MaskedSampler`` (masks, and the tokens budget-aware closing refused,
``samplers.masked.masked_draw``) and the transformers ``CorralLogitsProcessor`` — so the
semantics (ids beyond the mask are never allowed)
and the fast CPU path exist once. Lives in ``samplers`` (not ``engine``) because every sampler
needs it and the layering is grammars <- samplers <- engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["apply_token_bitmask_inplace", "bitmask_to_bool", "disallow_tokens_inplace"]

_BIT = torch.arange(32, dtype=torch.int32)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NEG_INF = float("-inf")


def bitmask_to_bool(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """Unpack int32 words ``[..., ceil(width/32)]`` into a bool tensor ``[..., width]`` (True = allowed)."""
    bits = (bitmask.unsqueeze(-1) >> _BIT.to(bitmask.device)) & 1
    return bits.reshape(*bitmask.shape[:-1], -1)[..., :width].bool()


def apply_token_bitmask_inplace(
    logits: torch.Tensor, bitmask: torch.Tensor | np.ndarray, indices: torch.Tensor | None = None
) -> None:
    """Set disallowed logits to ``-inf`` in place.

    Reference semantics::

        for row in (indices if indices is not None else range(logits.shape[0])):
            for token in range(logits.shape[-1]):
                allowed = token < 32 * bitmask.shape[-1] and (bitmask[row, token // 32] >> (token % 32)) & 1
                if not allowed:
                    logits[row, token] = -inf

    ``logits`` is ``[batch, width]`` or ``[width]`` (float, any device); ``bitmask`` is int32
    ``[batch, words]`` or ``[words]``, a torch tensor (CPU or the logits' device) or a numpy array.
    Logits wider than the mask (padded vocabulary) are masked out: ids beyond the mask are never
    allowed. CPU float32 logits take a numpy path (one ``unpackbits``, one ``putmask`` on a shared
    view), about twice as fast as the torch one on a 50k vocabulary.
    """
    if logits.dtype not in _FLOATS:
        raise TypeError(f"logits must be a floating tensor, got {logits.dtype}")
    if bitmask.dtype not in (torch.int32, np.int32):
        raise TypeError(f"bitmask must be int32 (see grammars.allocate_token_bitmask), got {bitmask.dtype}")
    rows = logits.unsqueeze(0) if logits.dim() == 1 else logits
    mask = bitmask[None] if bitmask.ndim == 1 else bitmask
    if mask.shape[0] != rows.shape[0]:
        raise ValueError(f"bitmask has {mask.shape[0]} rows but logits have {rows.shape[0]}")
    if indices is None and _numpy_writable(rows):
        _apply_numpy(rows, mask.numpy() if isinstance(mask, torch.Tensor) else mask)
    else:
        _apply_torch(rows, torch.from_numpy(mask) if isinstance(mask, np.ndarray) else mask, indices)


def disallow_tokens_inplace(
    logits: torch.Tensor, tokens: int | Sequence[int] | slice, rows: Sequence[int] | None = None
) -> None:
    """Set the logits of ``tokens`` (an id, ids or a slice of ids) to ``-inf`` in place, in every
    row of ``[batch, width]`` or ``[width]`` logits, or only in ``rows`` of a batch."""
    if rows is None:
        logits[..., tokens] = _NEG_INF
        return
    index = torch.as_tensor(list(rows), dtype=torch.long, device=logits.device)
    if isinstance(tokens, slice):
        logits[index, tokens] = _NEG_INF
    else:
        columns = torch.as_tensor(tokens, dtype=torch.long, device=logits.device).reshape(1, -1)
        logits[index[:, None], columns] = _NEG_INF


def _numpy_writable(logits: torch.Tensor) -> bool:
    """Whether ``logits.numpy()`` is a writable view of the same memory (the fast path applies)."""
    return (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous()
            and not logits.requires_grad)


def _apply_numpy(logits: torch.Tensor, words: np.ndarray) -> None:
    width = logits.shape[-1]
    allowed = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), axis=1, bitorder="little")
    if allowed.shape[1] < width:  # ids beyond the mask are never allowed
        allowed = np.pad(allowed, ((0, 0), (0, width - allowed.shape[1])))
    np.putmask(logits.numpy(), ~allowed[:, :width].view(bool), _NEG_INF)


def _apply_torch(logits: torch.Tensor, words: torch.Tensor, indices: torch.Tensor | None) -> None:
    words = words.to(logits.device)
    width = logits.shape[-1]
    covered = min(width, 32 * words.shape[-1])
    allowed = torch.zeros((words.shape[0], width), dtype=torch.bool, device=logits.device)
    allowed[:, :covered] = bitmask_to_bool(words, covered)
    if indices is None:
        logits.masked_fill_(~allowed, _NEG_INF)
    else:
        index = indices.to(logits.device)
        logits[index] = logits[index].masked_fill(~allowed[index], _NEG_INF)
