"""The masked (GCD) baseline: what it samples, and how far that is from the grammar-conditioned model.

- ``exact_masked`` (the enumerated GCD distribution) agrees with a closed form on the skewed
  grammar, and ``MaskedSampler`` draws from it (χ², p > 1e-4; measured p = 0.73);
- GCD is *distorted* where theory says so — the model prefers a prefix whose continuations are
  mostly ungrammatical: ``KL(GCD || Q) = 0.417`` nats against the exact target, threshold 0.3;
- GCD is *exact* where theory says so — every allowed token has the same expected future
  grammaticality ``c(w·t)``: KL below 1e-12.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from grammars import Compiler, TokenVocabulary
from sampler_tasks import SKEWED_EOS as EOS
from sampler_tasks import multibyte_task, skewed_lm, skewed_task
from samplers import MaskedSampler
from samplers.enumerate import (
    chisquare_pvalue,
    exact_masked,
    exact_target,
    hashed_logits_fn,
    kl_divergence,
    reference_decode,
)

pytestmark = pytest.mark.statistical


@pytest.fixture(scope="module")
def skewed():
    return skewed_task().grammar


def test_enumerated_gcd_matches_the_closed_form(skewed):
    gcd = exact_masked(skewed_lm, skewed.matcher(), 3)
    target, z = exact_target(skewed_lm, skewed.matcher(), 3)
    # GCD: the first step renormalises over {0, 1}; after "0" only "0" is allowed (prob 1 each)
    first0 = 0.75 / 0.99
    assert gcd[(0, 0, 0, 0, EOS)] == pytest.approx(first0)
    # "1" then bits: each step renormalises over {0, 1} (EOS masked), then EOS is forced
    assert gcd[(1, 1, 0, 1, EOS)] == pytest.approx((0.24 / 0.99) * (0.45 / 0.95) * (0.5 / 0.95) * (0.45 / 0.95))
    # the target: P(y) restricted to L
    p0000 = 0.75 * 0.5**3 * 0.8
    p1bits = 0.24 * (0.5 + 0.45) ** 3 * 0.8
    assert z == pytest.approx(p0000 + p1bits)
    assert target[(0, 0, 0, 0, EOS)] == pytest.approx(p0000 / z)
    assert sum(gcd.values()) == pytest.approx(1.0) and sum(target.values()) == pytest.approx(1.0)


def test_masking_distorts_where_future_grammaticality_differs(skewed):
    gcd = exact_masked(skewed_lm, skewed.matcher(), 3)
    target, _ = exact_target(skewed_lm, skewed.matcher(), 3)
    kl = kl_divergence(gcd, target)
    # GCD puts 0.76 on "0000", the target 0.31: c("0") = 0.1 but c("1") = 0.69
    assert gcd[(0, 0, 0, 0, EOS)] > 2 * target[(0, 0, 0, 0, EOS)]
    assert kl > 0.3, kl


def test_masking_is_exact_when_every_allowed_token_has_the_same_future():
    """``[ab][ab]`` with a model that never ends early and whose EOS probability after two letters
    is always 0.5 (letters otherwise random): every allowed token at every step has
    ``c(w·t) = 0.5``, so renormalising locally loses nothing."""
    vocab = TokenVocabulary.from_bytes([b"a", b"b", b""], eos_token_ids=[2])
    grammar = Compiler(vocab).compile_regex("[ab][ab]")
    noise = hashed_logits_fn(3, seed=3, scale=2.0)

    def lm(prefix):
        logits = noise(prefix)
        logits[2] = float("-inf")
        if len(prefix) == 2:
            logits = torch.log(torch.tensor([0.3, 0.2, 0.5]))
        return logits

    gcd = exact_masked(lm, grammar.matcher(), 3)
    target, _ = exact_target(lm, grammar.matcher(), 3)
    assert kl_divergence(gcd, target) < 1e-12
    assert len(target) == 4


def test_masked_sampler_draws_from_the_enumerated_gcd_distribution():
    grammar, lm, width = multibyte_task(seed=1, scale=1.0)
    gcd = exact_masked(lm, grammar.matcher(), width)
    gen = torch.Generator().manual_seed(0)
    sampler = MaskedSampler()
    samples = [tuple(reference_decode(sampler, None, lm, grammar.matcher(), generator=gen)[0]) for _ in range(600)]
    assert set(samples) <= set(gcd)
    pvalue = chisquare_pvalue(Counter(samples), gcd)
    assert pvalue > 1e-4, pvalue
    assert not math.isclose(sum(gcd.values()), 0.0)
