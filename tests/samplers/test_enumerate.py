"""Exact enumeration utilities: languages, sequence distributions, divergences, test aids."""

from __future__ import annotations

import math

import pytest
import torch

from grammars import Compiler, TokenVocabulary
from samplers import MaskedSampler
from samplers.enumerate import (
    batched,
    chisquare_pvalue,
    empirical,
    exact_masked,
    exact_proposal,
    exact_target,
    hashed_logits_fn,
    kl_divergence,
    language,
    normalize,
    reference_decode,
    total_variation,
)

PIECES = [b"a", b"b", b"ab", b""]


@pytest.fixture(scope="module")
def grammar():
    vocab = TokenVocabulary.from_bytes(PIECES, eos_token_ids=[3])
    return Compiler(vocab).compile_regex("ab?")


def test_language_lists_every_tokenization(grammar):
    assert language(grammar.matcher(), 4) == [(0, 1, 3), (0, 3), (2, 3)]


def test_infinite_language_needs_truncate():
    vocab = TokenVocabulary.from_bytes(PIECES, eos_token_ids=[3])
    g = Compiler(vocab).compile_regex("a+")
    with pytest.raises(ValueError, match="max_tokens"):
        language(g.matcher(), 4, max_tokens=3)
    assert language(g.matcher(), 4, max_tokens=3, truncate=True) == [(0, 0, 3), (0, 3)]


def test_exact_target_and_masked(grammar):
    uniform = lambda prefix: torch.zeros(4)  # noqa: E731 - every token 1/4
    target, z = exact_target(uniform, grammar.matcher(), 4)
    # P(a·EOS) = 1/16, P(ab·EOS) = 1/16 (token "ab"), P(a·b·EOS) = 1/64
    assert z == pytest.approx(1 / 16 + 1 / 16 + 1 / 64)
    assert target[(2, 3)] == pytest.approx((1 / 16) / z)
    gcd = exact_masked(uniform, grammar.matcher(), 4)
    # step 1: {a, ab} -> 1/2 each; after "a": {b, EOS} -> 1/2; after "ab"/"a b": EOS forced
    assert gcd == pytest.approx({(0, 3): 0.25, (0, 1, 3): 0.25, (2, 3): 0.5})
    assert kl_divergence(gcd, target) > 0


def test_exact_proposal_with_a_custom_step(grammar):
    dist = exact_proposal(lambda prefix, m: torch.tensor([1.0, 0.0, 0.0, 0.0]), grammar.matcher(), 4)
    assert dist == {}  # "a" then never EOS or b: no complete sequence has positive probability


def test_divergences():
    p = {(1,): 0.5, (2,): 0.5}
    q = {(1,): 0.25, (2,): 0.75}
    assert kl_divergence(p, p) == 0.0
    assert kl_divergence(p, q) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))
    assert kl_divergence(p, {(1,): 1.0}) == math.inf
    assert total_variation(p, q) == pytest.approx(0.25)
    assert total_variation(p, {(3,): 1.0}) == pytest.approx(1.0)
    assert normalize({(1,): 2.0, (2,): 6.0}) == {(1,): 0.25, (2,): 0.75}
    with pytest.raises(ValueError):
        normalize({})
    assert empirical([[1], [1], [2], (1,)]) == {(1,): 0.75, (2,): 0.25}
    with pytest.raises(ValueError):
        empirical([])


def test_chisquare_pvalue():
    probs = {"x": 0.5, "y": 0.3, "z": 0.2}
    assert chisquare_pvalue({"x": 50, "y": 30, "z": 20}, probs) == pytest.approx(1.0)
    assert chisquare_pvalue({"x": 90, "y": 5, "z": 5}, probs) < 1e-10
    assert chisquare_pvalue({"x": 50, "w": 1}, probs) == 0.0  # an impossible outcome
    # cross-check one value with the closed form for 1 degree of freedom: p = erfc(sqrt(x/2))
    stat = (60 - 50) ** 2 / 50 + (40 - 50) ** 2 / 50
    assert chisquare_pvalue({"h": 60, "t": 40}, {"h": 0.5, "t": 0.5}) == pytest.approx(math.erfc(math.sqrt(stat / 2)))


def test_hashed_logits_fn_is_deterministic_and_prefix_dependent():
    f = hashed_logits_fn(10, seed=1)
    g = hashed_logits_fn(10, seed=1)
    assert torch.equal(f([1, 2]), g([1, 2]))
    assert not torch.equal(f([1, 2]), f([2, 1]))
    assert not torch.equal(f([]), hashed_logits_fn(10, seed=2)([]))
    out = f([3])
    out += 100  # callers may modify what they get
    assert not torch.equal(f([3]), out)
    fixed = hashed_logits_fn(3, overrides={(): torch.tensor([1.0, 2.0, 3.0])}, bias=torch.ones(3))
    assert fixed([]).tolist() == [1.0, 2.0, 3.0]
    assert batched(f)([[1], [2, 3]]).shape == (2, 10)


def test_reference_decode(grammar):
    gen = torch.Generator().manual_seed(0)
    lm = hashed_logits_fn(4, seed=0)
    matcher = grammar.matcher()
    tokens, log_weight, checks = reference_decode(MaskedSampler(), None, lm, matcher, generator=gen)
    assert matcher.is_terminated() and tokens[-1] == 3 and log_weight == 0.0 and checks == 0
    assert tuple(tokens) in language(grammar.matcher(), 4)
