"""Packed token bitmasks: int32 words, bit ``i % 32`` of word ``i // 32`` set = token ``i`` allowed.

This is the layout XGrammar, llguidance and outlines-core share, so masks can go straight into
their kernels; ``engine`` owns applying them to logits.
"""

from __future__ import annotations

import numpy as np

__all__ = ["allocate_token_bitmask", "mask_words", "pack_bool", "unpack_bits", "bit_is_set", "bits_at"]


def _size(value: object, name: str, where: str, least: int) -> int:
    """An int argument ``>= least`` (``bool`` and floats refused: a size of ``2.5`` is a bug upstream)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < least:
        raise ValueError(f"{where}: {name} must be >= {least}, got {int(value)}")
    return int(value)


def mask_words(logits_width: int) -> int:
    """Number of int32 words for ``logits_width`` tokens."""
    return (_size(logits_width, "logits_width", "mask_words", 0) + 31) // 32


def allocate_token_bitmask(batch_size: int, logits_width: int) -> np.ndarray:
    """A zeroed ``int32[batch_size, ceil(logits_width / 32)]`` array for ``Matcher.fill_mask``.

    Raises ``TypeError`` for a size that is not an int and ``ValueError`` for a negative batch
    or a width below 1.
    """
    rows = _size(batch_size, "batch_size", "allocate_token_bitmask", 0)
    width = _size(logits_width, "logits_width", "allocate_token_bitmask", 1)
    return np.zeros((rows, (width + 31) // 32), dtype=np.int32)


def pack_bool(allowed: np.ndarray, logits_width: int) -> np.ndarray:
    """Pack a boolean vector (length <= logits_width) into a read-only int32 word array."""
    words = mask_words(logits_width)
    buf = np.zeros(words * 32, dtype=bool)
    buf[: allowed.shape[0]] = allowed
    packed = np.packbits(buf, bitorder="little").view("<u4").astype(np.uint32, copy=False).view(np.int32)
    packed.setflags(write=False)
    return packed


def unpack_bits(words: np.ndarray, logits_width: int) -> np.ndarray:
    """Inverse of ``pack_bool``: a boolean vector of length ``logits_width``."""
    raw = np.ascontiguousarray(words, dtype=np.int32).view(np.uint8)
    return np.unpackbits(raw, bitorder="little")[:logits_width].astype(bool)


def bits_at(words: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Whether each bit of ``tokens`` (an int array, in range, unchecked) is set in packed ``words``:
    a subset of a mask read without unpacking all of it."""
    return ((words[tokens >> 5].astype(np.int64) >> (tokens & 31)) & 1).astype(bool)


def bit_is_set(words: np.ndarray, token: int) -> bool:
    """Whether bit ``token`` of packed ``words`` is set (``token`` in range: a hot path, unchecked)."""
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)
