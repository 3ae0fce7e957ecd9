"""AWRS unit tests: the algorithm functions without any model, and the ``TokenSampler`` adapter."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from grammars import Compiler, TokenVocabulary
from samplers import AWRS, NoAllowedToken, SamplingParams, TokenSampler
from samplers._numeric import sample_categorical
from samplers.awrs import AWRSResult, awrs

ESTIMATORS = ["recursive", "redraw", "two_trace", "auto"]


@st.composite
def cases(draw):
    """Random vocabulary size, weights (some zero), constraint (possibly empty), budget, seed."""
    n = draw(st.integers(min_value=1, max_value=40))
    logits = draw(st.lists(st.floats(min_value=-20.0, max_value=20.0), min_size=n, max_size=n))
    zero = draw(st.sets(st.integers(0, n - 1), max_size=n))
    accepted = draw(st.sets(st.integers(0, n - 1), max_size=n))
    logps = torch.tensor(logits, dtype=torch.float64)
    if zero:
        logps[sorted(zero)] = float("-inf")
    max_rejects = draw(st.one_of(st.none(), st.integers(1, 5)))
    return logps, frozenset(accepted), max_rejects, draw(st.integers(0, 2**31 - 1))


def _call(logps, accepted, max_rejects, seed, estimator):
    calls = []

    def accept(t):
        calls.append(t)
        return t in accepted

    mask = torch.zeros(logps.shape[0], dtype=torch.bool)
    if accepted:
        mask[sorted(accepted)] = True
    result = awrs(
        logps,
        accept,
        torch.Generator().manual_seed(seed),
        estimator=estimator,
        max_rejects=max_rejects,
        allowed=lambda: mask,
    )
    return result, calls


@pytest.mark.parametrize("estimator", ESTIMATORS)
@settings(max_examples=60, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(case=cases())
# pinned: the only valid token has probability 0
@example(case=(torch.tensor([0.0, float("-inf"), -1.0], dtype=torch.float64), frozenset({1}), None, 0))
# pinned: a rare valid token behind a budget of 1
@example(case=(torch.tensor([5.0, -30.0, 0.0], dtype=torch.float64), frozenset({1}), 1, 3))
def test_contract(case, estimator):
    logps, accepted, max_rejects, seed = case
    result, calls = _call(logps, accepted, max_rejects, seed, estimator)
    positive = {t for t in range(logps.shape[0]) if logps[t] > float("-inf")}
    valid = accepted & positive
    assert result.checks == len(calls)
    assert len(set(calls)) == len(calls), "a token was checked twice"
    assert all(t in positive for t in calls), "a zero-probability token was checked"
    assert result.log_total == pytest.approx(float(torch.logsumexp(logps, 0)), abs=1e-9) or not positive
    if not valid:
        assert result.token is None and result.log_weight == float("-inf")
        return
    assert result.token in valid
    # Ẑ never exceeds the total mass, except redraw's p(x) + M (at most twice the total)
    slack = math.log(2.0) if estimator == "redraw" else 0.0
    assert result.log_weight <= result.log_total + slack + 1e-9
    if max_rejects is not None:
        assert result.rejects <= max_rejects
        if result.used_mask:
            assert result.rejects == max_rejects
    if result.log_weight > float("-inf"):
        # recursive: Ẑ ∈ {p(x), M}; redraw: Ẑ ∈ {p(x), p(x) + M}; two_trace: Ẑ = M/(n+1); exact tail: Ẑ = Z; all ≥ 0 and ≤ total
        assert math.isfinite(result.log_weight)


def test_same_seed_same_result():
    logps = torch.log_softmax(torch.randn(50, generator=torch.Generator().manual_seed(1)), 0)
    accept = lambda t: t % 3 == 0  # noqa: E731
    for estimator in ESTIMATORS:
        a = awrs(logps, accept, torch.Generator().manual_seed(9), estimator=estimator)
        b = awrs(logps, accept, torch.Generator().manual_seed(9), estimator=estimator)
        assert a == b


def test_everything_accepted_gives_the_exact_total():
    logps = torch.tensor([0.3, -1.0, 2.0, -0.5])
    for seed in range(20):
        for estimator in ("recursive", "two_trace"):
            r = awrs(logps, lambda t: True, torch.Generator().manual_seed(seed), estimator=estimator)
            assert r.log_weight == pytest.approx(float(torch.logsumexp(logps.double(), 0)))
            assert r.rejects == 0


def test_recursive_with_one_valid_token_is_exact():
    """With a single accepted token the recursive tail is always rejected: Ẑ = p(x) exactly."""
    logps = torch.log(torch.tensor([0.6, 0.1, 0.2, 0.1], dtype=torch.float64))
    for seed in range(30):
        r = awrs(logps, lambda t: t == 2, torch.Generator().manual_seed(seed), estimator="recursive")
        assert r.token == 2 and r.log_weight == pytest.approx(math.log(0.2))


def test_budget_falls_back_to_the_mask():
    logps = torch.log(torch.tensor([0.9, 0.05, 0.03, 0.02], dtype=torch.float64))
    mask = torch.tensor([False, False, True, True])
    seen = {}
    for seed in range(40):
        r = awrs(logps, lambda t: bool(mask[t]), torch.Generator().manual_seed(seed), estimator="recursive",
                 max_rejects=1, allowed=lambda: mask)
        if r.used_mask:
            assert r.rejects == 1 and r.log_weight == pytest.approx(math.log(0.05))
            seen["mask"] = True
        assert r.token in (2, 3)
    assert seen.get("mask")


def test_budget_needs_the_mask_callback():
    """Without ``allowed`` there is no budget: the walk goes on until it finds the valid token."""
    logps = torch.log(torch.tensor([0.5, 0.3, 0.19, 0.01], dtype=torch.float64))
    r = awrs(logps, lambda t: t == 3, torch.Generator().manual_seed(0), estimator="recursive", max_rejects=1)
    assert r.token == 3 and r.rejects == 3 and not r.used_mask


def test_large_vocabulary_walk_skips_removed_tokens():
    """The urn's gap skipping and rebuilds: a long walk over 100K tokens draws no token twice."""
    gen = torch.Generator().manual_seed(0)
    logps = torch.log_softmax(3 * torch.randn(100_000, generator=gen), 0)
    top = torch.topk(logps, 300).indices.tolist()
    valid = top[-1]
    calls = []

    def accept(t):
        calls.append(t)
        return t == valid

    r = awrs(logps, accept, gen, estimator="recursive")
    # every rejection, the acceptance, then the recursive tail check (rejected: one valid token)
    assert r.token == valid and len(calls) == len(set(calls)) and r.rejects == len(calls) - 2


@pytest.mark.parametrize("bad", [torch.zeros(2, 2), torch.tensor([float("nan"), 0.0]), torch.tensor([float("inf")])])
def test_bad_logps_raise(bad):
    with pytest.raises(ValueError):
        awrs(bad, lambda t: True)


def test_unknown_estimator_raises():
    with pytest.raises(ValueError, match="estimator"):
        awrs(torch.zeros(3), lambda t: True, estimator="geometric")
    with pytest.raises(ValueError, match="estimator"):
        AWRS(estimator="nope")
    with pytest.raises(ValueError, match="max_rejects"):
        AWRS(max_rejects=0)


def test_sample_categorical():
    gen = torch.Generator().manual_seed(0)
    weights = torch.tensor([0.0, 2.0, 0.0, 1.0])
    draws = [sample_categorical(weights, gen) for _ in range(300)]
    assert set(draws) == {1, 3}
    assert 150 < draws.count(1) < 250
    with pytest.raises(ValueError):
        sample_categorical(torch.zeros(3))
    with pytest.raises(ValueError):
        sample_categorical(torch.tensor([1.0, -1.0]))


def test_result_is_a_value():
    r = AWRSResult(token=1, log_weight=-0.5, checks=2)
    assert r == AWRSResult(1, -0.5, 2) and r.rejects == 0 and not r.used_mask


# --- the TokenSampler adapter ----------------------------------------------------------------


@pytest.fixture(scope="module")
def abc_grammar():
    pieces = [b"a", b"b", b"c", b"bc", b"cb", b""]
    vocab = TokenVocabulary.from_bytes(pieces, eos_token_ids=[5])
    return Compiler(vocab).compile_regex("a(b|bc)?")


def test_awrs_is_a_token_sampler(abc_grammar):
    sampler = AWRS()
    assert isinstance(sampler, TokenSampler)
    run = sampler.start(("prompt", "grammar"))
    matcher = abc_grammar.matcher()
    logits = torch.tensor([0.0, 3.0, 1.0, 0.5, 0.2, 0.1])
    draw = run.draw(logits, matcher, torch.Generator().manual_seed(0))
    assert draw.token == 0  # only "a" is allowed first
    assert draw.checks >= 1 and sampler.stats.checks == draw.checks and sampler.stats.draws == 1
    # log weight: log of the allowed probability mass, here exactly p("a") (one valid token)
    assert draw.log_weight == pytest.approx(float(torch.log_softmax(logits, 0)[0]))
    assert matcher.num_consumed == 0, "draw must not advance the matcher"
    run.finish([0], False)


def test_eos_is_a_token_like_the_others(abc_grammar):
    matcher = abc_grammar.matcher()
    matcher.advance(0)  # "a": accepting; EOS, "b" (1) and "bc" (3) allowed
    logits = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 5.0])  # the model wants EOS
    gen = torch.Generator().manual_seed(0)
    run = AWRS().start()
    tokens = {run.draw(logits, matcher, gen).token for _ in range(50)}
    assert 5 in tokens and tokens <= {1, 3, 5}
    matcher.advance(5)
    with pytest.raises(NoAllowedToken):
        run.draw(logits, matcher, gen)


def test_no_positive_probability_allowed_token_falls_back_with_zero_weight(abc_grammar):
    sampler = AWRS(params=SamplingParams(top_k=1))
    matcher = abc_grammar.matcher()
    logits = torch.tensor([0.0, 3.0, 1.0, 0.5, 0.2, 0.1])  # top-1 is "b", not allowed first
    draw = sampler.start().draw(logits, matcher, torch.Generator().manual_seed(0))
    assert draw.token == 0 and draw.log_weight == float("-inf")
    assert sampler.stats.zero_weight == 1


def test_budget_counts_mask_fallbacks(abc_grammar):
    sampler = AWRS(max_rejects=1)
    matcher = abc_grammar.matcher()
    logits = torch.tensor([-5.0, 3.0, 3.0, 3.0, 3.0, 3.0])  # "a" is unlikely but the only choice
    gen = torch.Generator().manual_seed(0)
    run = sampler.start()
    for _ in range(10):
        draw = run.draw(logits, matcher, gen)
        assert draw.token == 0 and draw.checks <= 1
        assert draw.log_weight == pytest.approx(float(torch.log_softmax(logits, 0)[0]))
    assert sampler.stats.mask_fallbacks >= 8


def test_pruning_removes_every_token_with_a_dead_byte():
    """The model wants one of twenty tokens starting with "x"; only "y…" is valid. The first
    rejected "x…" token rules out every token whose first byte cannot follow, so each draw makes
    at most 3 checks (one rejection, the accepted draw, the estimator's extra draw); without
    pruning it makes many."""
    pieces = [b"x" + bytes([c]) for c in range(ord("a"), ord("a") + 20)] + [b"y", b"ya", b""]
    vocab = TokenVocabulary.from_bytes(pieces, eos_token_ids=[len(pieces) - 1])
    grammar = Compiler(vocab).compile_regex("ya?")
    logits = torch.tensor([4.0] * 20 + [0.0, 0.0, -30.0])  # EOS (not allowed at the start) never drawn
    gen = torch.Generator().manual_seed(3)
    pruned, plain = AWRS(), AWRS(prune=False)
    runs = (pruned.start(), plain.start())
    for _ in range(30):
        for run in runs:
            draw = run.draw(logits, grammar.matcher(), gen)
            assert draw.token in (20, 21)
    assert pruned.stats.checks <= 3 * 30
    assert plain.stats.checks > 10 * 30
    matcher = grammar.matcher()
    assert sorted(matcher.rejection(0).tolist()) == list(range(20))
    assert matcher.rejection(20) is None


def test_rejection_sets_follow_the_failure_point():
    """A token failing at its second byte rules out the tokens with the same first byte and a
    second byte that cannot follow there, the tokens whose first byte cannot start, and nothing
    that could still be allowed."""
    pieces = [b"ab", b"ac", b"ad", b"a", b"abc", b"b", b"ba", b""]
    vocab = TokenVocabulary.from_bytes(pieces, eos_token_ids=[7])
    matcher = Compiler(vocab).compile_regex("a(b|bc)?").matcher()
    # "ac", "ad": 'c', 'd' cannot follow "a"; "b", "ba": 'b' cannot start
    assert sorted(matcher.rejection(1).tolist()) == [1, 2, 5, 6]
    assert sorted(matcher.rejection(5).tolist()) == [5, 6]  # 'b' cannot start
    assert matcher.rejection(0) is None and matcher.rejection(4) is None
    assert matcher.rejection(7).tolist() == [7]  # EOS: not accepting yet, and alone


@pytest.mark.parametrize("pattern", ["a(b|bc)?", "(ab|ba)+c?", "[a-c]{2,4}d", "abcd|abd|b"])
def test_check_proves_only_what_allows_says(pattern):
    """On fresh matchers (no mask cached) and after each prefix: every id in a check's rejected
    set is disallowed, every id in its accepted set allowed, and the token is in the right one;
    a token failing after a live prefix proves that prefix's tokens allowed."""
    pieces = [b"a", b"b", b"c", b"d", b"ab", b"ba", b"bc", b"abc", b"abd", b"cd", b"abcd", b"bca", b"dd", b""]
    vocab = TokenVocabulary.from_bytes(pieces, eos_token_ids=[len(pieces) - 1])
    grammar = Compiler(vocab).compile_regex(pattern)
    for prefix in ([], [0], [1], [4]):
        base = grammar.matcher()
        if base.try_advance(prefix) != len(prefix):
            continue
        allowed = {t for t in range(len(pieces)) if base.fork().allows(t)}
        for token in range(len(pieces)):
            result = base.fork().check(token)
            assert result.allowed == (token in allowed)
            assert token in (result.accepted if result.allowed else result.rejected)
            assert not set(result.rejected.tolist()) & allowed, (pattern, prefix, token)
            assert set(result.accepted.tolist()) <= allowed, (pattern, prefix, token)
    matcher = Compiler(vocab).compile_regex("abcd").matcher()
    assert sorted(matcher.check(8).accepted.tolist()) == [0, 4]  # "abd" fails at 'd': "a", "ab" are allowed


def test_known_allowed_tokens_cost_no_check():
    """AWRS asks the matcher once per token it cannot answer from earlier checks: after "abd" is
    rejected (its prefix "ab" was walked alive), drawing "ab" costs nothing."""
    pieces = [b"abd", b"ab", b"x", b""]
    vocab = TokenVocabulary.from_bytes(pieces, eos_token_ids=[3])
    grammar = Compiler(vocab).compile_regex("abc?")
    logits = torch.tensor([5.0, 0.0, -40.0, -40.0])
    for seed in range(20):
        draw = AWRS(weight=False).start().draw(logits, grammar.matcher(), torch.Generator().manual_seed(seed))
        assert draw.token == 1
        assert draw.checks == 1  # "abd" rejected and "ab" then known, or "ab" drawn first


def test_unweighted_sampler_spends_no_check_on_the_estimate(abc_grammar):
    """Same seed, same draws: the unweighted sampler makes the same checks up to the accepted
    token and stops there (weight nan); the weighted one checks one more token for its estimate."""
    matcher = abc_grammar.matcher()
    logits = torch.tensor([1.0, 0.5, 0.5, 0.2, 0.2, 0.0])  # "a" (the only valid first token) is favoured
    for seed in range(20):
        plain = AWRS(weight=False).start().draw(logits, matcher, torch.Generator().manual_seed(seed))
        weighted = AWRS().start().draw(logits, matcher, torch.Generator().manual_seed(seed))
        assert plain.token == weighted.token == 0
        assert math.isnan(plain.log_weight) and not math.isnan(weighted.log_weight)
        assert weighted.checks in (plain.checks, plain.checks + 1)
        assert plain.checks <= 3  # one rejection rules out every b/c-led token, EOS is the other
