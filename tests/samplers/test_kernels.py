"""``samplers.kernels``: the one owner of writing ``-inf`` into logits, against its reference loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from samplers import apply_token_bitmask_inplace
from samplers.kernels import disallow_tokens_inplace


def reference(logits: torch.Tensor, words: np.ndarray) -> torch.Tensor:
    """The docstring's loop, literally: a token is allowed iff its bit is set inside the mask."""
    out = logits.clone()
    for row in range(out.shape[0]):
        for token in range(out.shape[-1]):
            inside = token < 32 * words.shape[-1]
            if not (inside and (int(words[row, token // 32]) >> (token % 32)) & 1):
                out[row, token] = float("-inf")
    return out


def random_case(width: int, mask_width: int, dtype=np.float32):
    rng = np.random.default_rng(width)
    words = rng.integers(-(2**31), 2**31 - 1, size=(3, (mask_width + 31) // 32), dtype=np.int64).astype(np.int32)
    return torch.from_numpy(rng.standard_normal((3, width)).astype(dtype)), words


@pytest.mark.parametrize("width", [268, 300, 1000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["numpy-path", "torch-path"])
def test_mask_application_equals_the_reference(width, dtype):
    logits, words = random_case(width, min(width, 268), dtype)  # wider logits than the mask: never allowed
    expected = reference(logits, words)
    as_numpy = logits.clone()
    apply_token_bitmask_inplace(as_numpy, words)
    as_tensor = logits.clone()
    apply_token_bitmask_inplace(as_tensor, torch.from_numpy(words))
    assert torch.equal(as_numpy, expected) and torch.equal(as_tensor, expected)


def test_paths_agree_on_a_full_vocabulary():
    logits, words = random_case(50_257, 50_257)
    fast = logits.clone()
    apply_token_bitmask_inplace(fast, words)  # CPU float32: numpy
    slow = logits.double()
    apply_token_bitmask_inplace(slow, words)  # float64: torch
    assert torch.equal(fast.double(), slow)
    assert torch.isneginf(fast).any() and torch.isfinite(fast).any()


def test_one_row_and_selected_rows():
    logits, words = random_case(300, 300)
    expected = reference(logits, words)
    row = logits[1].clone()
    apply_token_bitmask_inplace(row, words[1])
    assert torch.equal(row, expected[1])
    some = logits.clone()
    apply_token_bitmask_inplace(some, torch.from_numpy(words), indices=torch.tensor([0, 2]))
    assert torch.equal(some[[0, 2]], expected[[0, 2]]) and torch.equal(some[1], logits[1])


def test_bad_inputs_are_refused():
    logits, words = random_case(64, 64)
    with pytest.raises(TypeError, match="int32"):
        apply_token_bitmask_inplace(logits, words.astype(np.int64))
    with pytest.raises(TypeError, match="floating"):
        apply_token_bitmask_inplace(logits.long(), words)
    with pytest.raises(ValueError, match="rows"):
        apply_token_bitmask_inplace(logits, words[:2])


def test_disallow_tokens_by_id_ids_slice_and_rows():
    logits = torch.zeros((3, 8))
    disallow_tokens_inplace(logits, slice(6, None))
    disallow_tokens_inplace(logits, [1, 3], rows=[0, 2])
    disallow_tokens_inplace(logits[1], 0)
    disallow_tokens_inplace(logits, slice(4, 5), rows=[1])
    out = torch.isneginf(logits)
    assert out[0].nonzero().flatten().tolist() == [1, 3, 6, 7]
    assert out[1].nonzero().flatten().tolist() == [0, 4, 6, 7]
    assert out[2].nonzero().flatten().tolist() == [1, 3, 6, 7]
