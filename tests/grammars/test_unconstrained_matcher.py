"""The unconstrained matcher: every token of the vocabulary, EOS at any time, never a padding id."""

from __future__ import annotations

import pytest


def test_unconstrained_matcher_allows_every_token_but_padding():
    import numpy as np

    from grammars import (
        RollbackError,
        TokenRejected,
        TokenVocabulary,
        UnconstrainedMatcher,
        allocate_token_bitmask,
    )
    from grammars.bitmask import unpack_bits

    padded = TokenVocabulary.from_bytes([b"a", b"b", b""], eos_token_ids=[2], logits_width=40)
    m = UnconstrainedMatcher(padded)
    mask = allocate_token_bitmask(1, 40)
    m.fill_mask(mask, 0)
    assert np.flatnonzero(unpack_bits(mask[0], 40)).tolist() == [0, 1, 2]  # no padding columns
    assert m.allows(0) and not m.allows(39) and m.is_accepting()
    m.advance(0)
    fork = m.fork()
    m.advance(2)
    assert m.is_terminated() and not m.allows(0) and not fork.is_terminated()
    with pytest.raises(TokenRejected):
        m.advance(1)
    m.rollback(1)
    assert m.num_consumed == 1
    with pytest.raises(RollbackError):
        m.rollback(5)
