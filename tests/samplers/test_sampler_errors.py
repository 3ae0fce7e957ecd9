"""``NoAllowedToken`` is one class, in corral's ``ConstraintError`` tree, and every sampler raises it
where the grammar allows nothing — so one ``except grammars.ConstraintError`` catches them all."""

from __future__ import annotations

import pytest
import torch

import grammars
import samplers
from grammars import Compiler, TokenVocabulary
from grammars.errors import NoAllowedToken
from samplers import ASAp, AWRS, MaskedSampler


def test_no_allowed_token_is_a_constraint_error():
    assert samplers.NoAllowedToken is NoAllowedToken is samplers.base.NoAllowedToken
    assert issubclass(samplers.NoAllowedToken, grammars.ConstraintError)
    assert issubclass(samplers.NoAllowedToken, grammars.MatchError)
    assert issubclass(samplers.NoAllowedToken, RuntimeError)  # handlers written before the tree still catch it


@pytest.mark.parametrize("sampler", [MaskedSampler(), ASAp(), AWRS()], ids=lambda s: type(s).__name__)
def test_every_sampler_raises_it_on_a_terminated_matcher(sampler):
    vocab = TokenVocabulary.from_bytes([b"a", b""], eos_token_ids=[1])
    matcher = Compiler(vocab).compile_regex("a").matcher()
    matcher.advance(0)
    matcher.advance(1)  # EOS: nothing may follow
    with pytest.raises(grammars.ConstraintError) as caught:
        sampler.start("k").draw(torch.zeros(2), matcher, torch.Generator().manual_seed(0))
    assert type(caught.value) is NoAllowedToken
