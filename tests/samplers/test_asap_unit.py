"""ASAp unit tests: the trie, the pure update functions, the sampler wiring and persistence."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from grammars import Compiler, TokenVocabulary
from samplers import ASAp, NoAllowedToken, SamplingParams, TokenSampler
from samplers.asap import AsapTrie, asap_weights, backpropagate, expected_future
from samplers.enumerate import draw_sequence, exact_asap, exact_masked, hashed_logits_fn, reference_decode

PIECES = [b"0", b"1", b""]


def skewed_lm(prefix):
    probs = [0.75, 0.24, 0.01] if not prefix else [0.5, 0.45, 0.05] if len(prefix) < 4 else [0.1, 0.1, 0.8]
    return torch.log(torch.tensor(probs))


@pytest.fixture(scope="module")
def skewed():
    vocab = TokenVocabulary.from_bytes(PIECES, eos_token_ids=[2])
    return Compiler(vocab).compile_regex("0000|1[01]{3}")


def test_asap_weights_masks_and_applies_estimates():
    probs = np.array([0.5, 0.3, 0.2])
    allowed = np.array([True, True, False])
    w = asap_weights(probs, allowed, [], [])
    assert w.dtype == np.float64 and w.tolist() == pytest.approx([0.5, 0.3, 0.0])
    w = asap_weights(probs, allowed, [1], [0.5])
    assert w.tolist() == pytest.approx([0.5, 0.15, 0.0])
    assert probs.tolist() == [0.5, 0.3, 0.2], "inputs are not modified"


def test_expected_future_is_monotone():
    assert expected_future(0.8, 0.1) == pytest.approx(0.7)
    assert expected_future(0.8, 0.1, previous=0.5) == 0.5  # never increases
    assert expected_future(0.1, 0.2) == 0.0  # float drift below zero is clipped


def test_backpropagate_by_hand():
    """root --a(0.6)--> u --b(0.5)--> leaf; root mass 0.9, u mass 0.4 (mask removed 0.6 there)."""
    trie = AsapTrie()
    u = trie.child(0, 7, 0.6)
    leaf = trie.child(u, 8, 0.5)
    trie.mass[0] = 0.9
    trie.mass[u] = 0.4
    backpropagate(trie, [0, u, leaf])
    assert trie.chat[leaf] == 1.0  # never expanded
    assert trie.chat[u] == pytest.approx(0.4)
    # root: 0.9 allowed, minus the explored child's shortfall 0.6 * (1 - 0.4)
    assert trie.chat[0] == pytest.approx(0.9 - 0.6 * 0.6)
    assert trie.deficit[0] == pytest.approx(0.36)
    before = trie.chat[0]
    backpropagate(trie, [0, u, leaf])  # idempotent
    assert trie.chat[0] == before


def test_first_sample_is_gcd_and_estimates_only_decrease(skewed):
    sampler = ASAp()
    gen = torch.Generator().manual_seed(0)
    gcd = exact_masked(skewed_lm, skewed.matcher(), 3)
    assert exact_asap(sampler, "k", skewed_lm, skewed.matcher(), 3) == pytest.approx(gcd)
    previous: dict[int, float] = {}
    for _ in range(30):
        reference_decode(sampler, "k", skewed_lm, skewed.matcher(), generator=gen)
        trie = sampler.trie("k")
        for node, value in previous.items():
            assert trie.chat[node] <= value + 1e-15
        previous = {node: trie.chat[node] for node in range(len(trie))}
    # the root estimate over-approximates Z = P(y ∈ L), tightly once most paths were explored
    z = 0.75 * 0.5**3 * 0.8 + 0.24 * 0.95**3 * 0.8
    assert z * (1 - 1e-6) <= sampler.trie("k").chat[0] <= 1.05 * z


def test_asap_is_a_token_sampler_and_keeps_one_trie_per_key(skewed):
    sampler = ASAp()
    assert isinstance(sampler, TokenSampler)
    gen = torch.Generator().manual_seed(1)
    reference_decode(sampler, ("p1", "g"), skewed_lm, skewed.matcher(), generator=gen)
    reference_decode(sampler, ("p2", "g"), skewed_lm, skewed.matcher(), generator=gen)
    reference_decode(sampler, ("p1", "g"), skewed_lm, skewed.matcher(), generator=gen)
    assert set(sampler.keys()) == {("p1", "g"), ("p2", "g")}
    assert sampler.trie(("missing",)) is None
    assert len(sampler.trie(("p1", "g"))) >= len(sampler.trie(("p2", "g")))


def test_max_keys_drops_the_least_recently_used(skewed):
    sampler = ASAp(max_keys=2)
    for key in ("a", "b", "a", "c"):
        reference_decode(sampler, key, skewed_lm, skewed.matcher(), generator=torch.Generator().manual_seed(0))
    assert sampler.keys() == ["a", "c"]
    with pytest.raises(ValueError):
        ASAp(max_keys=0)


def test_draw_never_advances_and_checks_its_path(skewed):
    sampler = ASAp()
    run = sampler.start("k")
    matcher = skewed.matcher()
    gen = torch.Generator().manual_seed(0)
    token = run.draw(skewed_lm([]), matcher, gen).token
    assert matcher.num_consumed == 0
    matcher.advance(token)
    matcher.advance(0 if token == 1 else 0)  # a token the run did not draw
    with pytest.raises(RuntimeError, match="every token"):
        run.draw(skewed_lm([token, 0]), matcher, gen)


def test_finish_twice_is_a_no_op_and_draw_after_finish_raises(skewed):
    sampler = ASAp()
    gen = torch.Generator().manual_seed(0)
    run = sampler.start("k")
    matcher = skewed.matcher()
    tokens, _, _ = draw_sequence(run, skewed_lm, matcher, generator=gen)
    assert matcher.is_terminated()
    with pytest.raises(NoAllowedToken):
        run.draw(skewed_lm(tokens), matcher, gen)
    run.finish(tokens, True)
    snapshot = list(sampler.trie("k").chat)
    run.finish(tokens, True)
    assert list(sampler.trie("k").chat) == snapshot
    with pytest.raises(RuntimeError, match="finished"):
        run.draw(skewed_lm([]), skewed.matcher(), gen)


def test_incomplete_sequences_still_update_soundly(skewed):
    sampler = ASAp()
    gen = torch.Generator().manual_seed(3)
    tokens, _, _ = reference_decode(sampler, "k", skewed_lm, skewed.matcher(), max_tokens=2, generator=gen)
    assert len(tokens) == 2
    trie = sampler.trie("k")
    assert all(0.0 <= trie.chat[n] <= 1.0 for n in range(len(trie)))


def test_zero_mass_falls_back_to_masked_sampling(skewed):
    sampler = ASAp(SamplingParams(top_k=1))
    run = sampler.start("k")
    matcher = skewed.matcher()
    matcher.advance(0)  # after "0" only "0" is allowed; the model's top-1 is "0" too ...
    logits = torch.tensor([0.0, 5.0, 0.0])  # ... unless it prefers "1"
    token = run.draw(logits, matcher, torch.Generator().manual_seed(0)).token
    assert token == 0


def test_state_dict_and_pickle_round_trip(skewed):
    sampler = ASAp()
    gen = torch.Generator().manual_seed(4)
    for _ in range(10):
        reference_decode(sampler, ("prompt", 1), skewed_lm, skewed.matcher(), generator=gen)
    proposal = exact_asap(sampler, ("prompt", 1), skewed_lm, skewed.matcher(), 3)
    state = sampler.state_dict()
    assert state["version"] == 1 and isinstance(state["tries"][0][1]["chat"], np.ndarray)
    restored = ASAp()
    restored.load_state_dict(state)
    assert exact_asap(restored, ("prompt", 1), skewed_lm, skewed.matcher(), 3) == pytest.approx(proposal)
    clone = pickle.loads(pickle.dumps(sampler))
    assert exact_asap(clone, ("prompt", 1), skewed_lm, skewed.matcher(), 3) == pytest.approx(proposal)
    # learning continues after a restore
    reference_decode(restored, ("prompt", 1), skewed_lm, skewed.matcher(), generator=gen)
    with pytest.raises(ValueError, match="version"):
        ASAp().load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match="malformed"):
        AsapTrie.from_state_dict({k: v[:0] for k, v in state["tries"][0][1].items()})


def test_trie_lookup_and_estimate():
    trie = AsapTrie()
    a = trie.child(0, 3, 0.5)
    assert trie.child(0, 3, 0.9) == a and trie.prob[a] == 0.5  # existing child kept
    b = trie.child(a, 4, 0.25)
    assert trie.lookup([3, 4]) == b and trie.lookup([4]) is None and trie.lookup([]) == 0
    assert trie.estimate([3, 4]) == 1.0 and trie.estimate([9]) == 1.0
    trie.chat[b] = 0.5
    assert trie.child_estimates(a) == ([4], [0.5]) and trie.child_estimates(b) == ([], [])
    assert not trie.is_expanded(a)


def test_multibyte_tokens_and_long_vocabulary_logits():
    """Logits wider than the vocabulary (padding columns) are never sampled."""
    pieces = [b"a", b"b", b"ab", b""]
    vocab = TokenVocabulary.from_bytes(pieces, eos_token_ids=[3], logits_width=64)
    grammar = Compiler(vocab).compile_regex("(ab)+")
    lm = hashed_logits_fn(64, seed=5, scale=3.0)
    sampler = ASAp()
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        tokens, _, _ = reference_decode(sampler, "k", lm, grammar.matcher(), max_tokens=12, generator=gen)
        assert all(t < 4 for t in tokens)
        assert math.isfinite(sampler.trie("k").chat[0])
