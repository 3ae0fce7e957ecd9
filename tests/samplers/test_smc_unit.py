"""SMC unit tests: resampling, ESS, result invariants, budgets and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grammars import Compiler, TokenVocabulary
from samplers import SMC, SMCResult
from samplers.enumerate import batched, hashed_logits_fn
from samplers.smc import effective_sample_size, resample


@pytest.fixture(scope="module")
def grammar():
    pieces = [b"a", b"b", b"c", b"ab", b"bc", b""]
    vocab = TokenVocabulary.from_bytes(pieces, eos_token_ids=[5])
    return Compiler(vocab).compile_regex("(a|b)+c")


def test_effective_sample_size():
    assert effective_sample_size(np.zeros(8)) == pytest.approx(8)
    assert effective_sample_size(np.array([0.0, -np.inf, -np.inf])) == pytest.approx(1)
    assert effective_sample_size(np.full(3, -np.inf)) == 0.0
    assert effective_sample_size(np.log([1.0, 3.0])) == pytest.approx(16 / 10)


@pytest.mark.parametrize("method", ["multinomial", "systematic"])
def test_resample_is_proportional_and_skips_zero_weights(method):
    gen = torch.Generator().manual_seed(0)
    lw = np.log([0.1, 0.0 + 1e-300, 0.6, 0.3])
    lw[1] = -np.inf
    counts = np.zeros(4)
    for _ in range(200):
        counts += np.bincount(resample(lw, 10, method, gen), minlength=4)
    assert counts[1] == 0
    assert counts / counts.sum() == pytest.approx([0.1, 0.0, 0.6, 0.3], abs=0.03)
    if method == "systematic":  # each index appears floor or ceil of n·w times
        idx = resample(lw, 10, method, gen)
        assert abs(np.sum(idx == 2) - 6) <= 1
    with pytest.raises(ValueError):
        resample(np.full(3, -np.inf), 2, method, gen)
    with pytest.raises(ValueError):
        resample(lw, 2, "stratified", gen)


def test_run_invariants(grammar):
    lm = hashed_logits_fn(6, seed=1, scale=1.0)
    matcher = grammar.matcher()
    result = SMC(particles=16).run(batched(lm), matcher, max_tokens=12, generator=torch.Generator().manual_seed(0))
    assert isinstance(result, SMCResult)
    assert matcher.num_consumed == 0, "run must not advance the caller's matcher"
    assert len(result.tokens) == 16 and result.log_weights.shape == (16,)
    for seq, done in zip(result.tokens, result.completed):
        if done:
            assert seq[-1] == 5
            probe = grammar.matcher()
            assert probe.try_advance(seq) == len(seq) and probe.is_terminated()
    posterior = result.posterior()
    assert sum(posterior.values()) == pytest.approx(1.0)
    assert result.estimate(lambda y: 1.0) == pytest.approx(1.0)
    assert result.sample(torch.Generator().manual_seed(1)) in posterior
    assert result.checks > 0 and result.steps <= 12 and 0 < result.ess <= 16
    assert len(result.ess_history) == result.steps
    assert math.isfinite(result.log_ml) and result.log_ml <= 1e-9  # every incremental Ẑ is <= 1


def test_budget_leaves_particles_incomplete(grammar):
    lm = hashed_logits_fn(6, seed=2)

    def no_end(prefixes):
        logits = batched(lm)(prefixes)
        logits[:, 2] = -30.0  # "c" is very unlikely ...
        logits[:, 4] = -30.0  # ... and so is "bc"
        return logits

    result = SMC(particles=4).run(no_end, grammar.matcher(), max_tokens=3, generator=torch.Generator().manual_seed(0))
    assert result.steps == 3
    assert not result.completed.any()
    assert result.log_ml == float("-inf") and result.posterior() == {}
    assert math.isnan(result.estimate(lambda y: 1.0))
    with pytest.raises(ValueError, match="no complete particle"):
        result.sample()


def test_dead_particles(grammar):
    """A model that gives every allowed token zero probability (top-k 1 on a rejected token)."""
    from samplers import SamplingParams

    def wrong(prefixes):
        logits = torch.zeros(len(prefixes), 6)
        logits[:, 5] = 10.0  # EOS is never allowed first
        return logits

    smc = SMC(particles=3, params=SamplingParams(top_k=1))
    result = smc.run(wrong, grammar.matcher(), max_tokens=5, generator=torch.Generator().manual_seed(0))
    assert result.steps == 1 and np.all(result.log_weights == -np.inf)
    assert result.log_ml == float("-inf")


def test_resampling_happens_and_keeps_the_mean_weight(grammar):
    lm = hashed_logits_fn(6, seed=3, scale=3.0)
    always = SMC(particles=8, ess_threshold=1.0)
    result = always.run(batched(lm), grammar.matcher(), max_tokens=10, generator=torch.Generator().manual_seed(0))
    assert result.resampled, "ess_threshold=1 resamples at every step with unequal weights"
    never = SMC(particles=8, ess_threshold=0.0)
    result = never.run(batched(lm), grammar.matcher(), max_tokens=10, generator=torch.Generator().manual_seed(0))
    assert result.resampled == ()


def test_bad_arguments(grammar):
    with pytest.raises(ValueError):
        SMC(particles=0)
    with pytest.raises(ValueError):
        SMC(ess_threshold=1.5)
    with pytest.raises(ValueError):
        SMC(resampling="residual")
    with pytest.raises(ValueError, match="max_tokens"):
        SMC().run(lambda p: torch.zeros(len(p), 6), grammar.matcher(), max_tokens=-1)
    with pytest.raises(ValueError, match="shape"):
        SMC(particles=2).run(lambda p: torch.zeros(6), grammar.matcher(), max_tokens=3)


def test_zero_budget_and_terminated_matcher(grammar):
    result = SMC(particles=2).run(lambda p: torch.zeros(len(p), 6), grammar.matcher(), max_tokens=0)
    assert result.steps == 0 and not result.completed.any()
    done = grammar.matcher()
    done.advance(0)
    done.advance(2)
    done.advance(5)
    result = SMC(particles=2).run(lambda p: torch.zeros(len(p), 6), done, max_tokens=4)
    assert result.completed.all() and result.log_ml == pytest.approx(0.0)
