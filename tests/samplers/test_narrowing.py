"""``NarrowedMatcher`` keeps the matcher contract, and samplers draw from it without leaving it.

Budget-aware closing hands samplers the row's matcher narrowed by a condition on the next token;
the laws kit checks the narrowed matcher like any other kind, and the samplers' lazy paths
(draw from the base mask, ask about the drawn token) must agree with the exact narrowed mask.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.closing import BudgetClosing, ClosingPlanner
from grammars import Compiler, TokenRejected, allocate_token_bitmask
from grammars.bitmask import unpack_bits
from grammars.testing.laws import MatcherLaws, allowed_tokens
from samplers import AWRS, ASAp, MaskedSampler, SamplingParams
from samplers.masked import masked_draw
from samplers.narrowing import NarrowedMatcher

LIST = r"\[[a-z]+(,[a-z]+)*\]"


@pytest.fixture(scope="module")
def compiler(byte_vocab):
    return Compiler(byte_vocab)


def no_letter_b(matcher, token: int) -> bool:
    return token != ord("b")


def budget(compiler, vocab, limit: int, pattern: str = LIST) -> NarrowedMatcher:
    return BudgetClosing(ClosingPlanner(vocab), limit).narrow(compiler.compile_regex(pattern).matcher())


@pytest.mark.parametrize("limit", [4, 6, 9])
def test_a_budget_narrowing_keeps_every_law(byte_vocab, compiler, limit):
    narrowed = budget(compiler, byte_vocab, limit)
    laws = MatcherLaws(narrowed, byte_vocab)
    for token in byte_vocab.encode("[ab,c]")[: limit - 1]:
        allowed = laws.check_all()
        if not allowed[token]:
            break
        narrowed.advance(token)
    laws.check_all()


def test_fill_mask_is_the_base_mask_without_refused_tokens(byte_vocab, compiler):
    base = compiler.compile_regex("[a-c]+x").matcher()
    narrowed = NarrowedMatcher(base, no_letter_b, byte_vocab)
    before = allowed_tokens(base, byte_vocab.logits_width)
    after = allowed_tokens(narrowed, byte_vocab.logits_width)
    assert before[ord("b")] and not after[ord("b")]
    before[ord("b")] = False
    assert np.array_equal(before, after)
    assert narrowed.refusals >= 1 and base.num_consumed == 0  # the condition never moves the base


def test_eos_is_never_narrowed_away(byte_vocab, compiler):
    narrowed = NarrowedMatcher(compiler.compile_regex("a").matcher(), lambda m, t: False, byte_vocab)
    narrowed.base.advance(ord("a"))
    eos = min(byte_vocab.eos_token_ids)
    assert narrowed.is_accepting() and narrowed.allows(eos) and narrowed.admits(eos)
    assert narrowed.forced_tokens() == [] and narrowed.shortest_completion() == ()


def test_refused_tokens_are_rejected_with_the_state_unchanged(byte_vocab, compiler):
    narrowed = NarrowedMatcher(compiler.compile_regex("[a-c]+x").matcher(), no_letter_b, byte_vocab)
    with pytest.raises(TokenRejected, match="narrowing"):
        narrowed.advance(ord("b"))
    assert narrowed.num_consumed == 0 and narrowed.try_advance([ord("a"), ord("b")]) == 1
    assert not narrowed.check(ord("b")).allowed and narrowed.rejection(ord("b")) is not None
    fork = narrowed.fork()
    assert isinstance(fork, NarrowedMatcher) and not fork.allows(ord("b")) and fork.base is not narrowed.base


def test_check_never_vouches_for_tokens_the_narrowing_refuses(byte_vocab, compiler):
    """The base's check of a rejected token lists byte-prefix tokens it proved allowed; the
    narrowing may refuse those, so a narrowed check drops them (AWRS would trust them)."""
    vocab = byte_vocab
    ab = vocab.token_bytes.index(b"ab")
    base = compiler.compile_regex("a[a-c]").matcher()
    assert ord("a") in base.check(ab).accepted.tolist() or not base.check(ab).allowed
    narrowed = NarrowedMatcher(base, lambda m, t: t != ord("a"), vocab)
    result = narrowed.check(vocab.token_bytes.index(b"12"))
    assert not result.allowed and not len(result.accepted)


@pytest.mark.parametrize("lazy_checks", [0, 1, 16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masked_draw_stays_inside_the_narrowing(byte_vocab, compiler, lazy_checks, temperature):
    base = compiler.compile_regex("[a-c]+x").matcher()
    narrowed = NarrowedMatcher(base, no_letter_b, byte_vocab, lazy_checks=lazy_checks)
    logits = torch.zeros(byte_vocab.logits_width)
    logits[ord("b")] = 20.0  # the model's favourite is refused
    logits[ord("c")] = 5.0
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=temperature)
    draws = [masked_draw(logits, narrowed, params, gen) for _ in range(50)]
    admitted = set(np.flatnonzero(allowed_tokens(narrowed, byte_vocab.logits_width)).tolist())
    assert ord("b") not in draws and set(draws) <= admitted and ord("c") in draws
    if temperature == 0:
        assert set(draws) == {ord("c")}  # greedy over the admitted tokens


def test_masked_draw_matches_the_exact_narrowed_distribution(byte_vocab, compiler):
    base = compiler.compile_regex("[a-e]+x").matcher()
    narrowed = NarrowedMatcher(base, lambda m, t: t not in (ord("b"), ord("d")), byte_vocab, lazy_checks=2)
    logits = torch.full((byte_vocab.logits_width,), -5.0)
    for piece, value in zip("abcde", (1.0, 3.0, 0.0, 3.0, -1.0)):
        logits[ord(piece)] = value
    exact = {ord(p): float(np.exp(v)) for p, v in zip("ace", (1.0, 0.0, -1.0))}
    total = sum(exact.values())
    gen = torch.Generator().manual_seed(1)
    draws = [masked_draw(logits, narrowed, SamplingParams(), gen) for _ in range(3000)]
    for token, p in exact.items():
        assert abs(draws.count(token) / len(draws) - p / total) < 0.03


def test_samplers_draw_admitted_tokens(byte_vocab, compiler):
    logits = torch.zeros(byte_vocab.logits_width)
    logits[ord("b")] = 30.0
    for sampler in (MaskedSampler(), AWRS(), ASAp()):
        narrowed = NarrowedMatcher(compiler.compile_regex("[a-c]+x").matcher(), no_letter_b, byte_vocab)
        gen = torch.Generator().manual_seed(0)
        run = sampler.start("k")
        draw = run.draw(logits, narrowed, gen)
        assert draw.token != ord("b") and narrowed.allows(draw.token), type(sampler).__name__


def test_asap_records_refused_draws_as_dead_children(byte_vocab, compiler):
    sampler = ASAp()
    logits = torch.zeros(byte_vocab.logits_width)
    logits[ord("b")] = 30.0  # almost all the mass on a token the narrowing refuses
    narrowed = NarrowedMatcher(compiler.compile_regex("[a-c]+x").matcher(), no_letter_b, byte_vocab)
    run = sampler.start("k")
    draw = run.draw(logits, narrowed, torch.Generator().manual_seed(0))
    trie = sampler.trie("k")
    dead = trie.lookup([ord("b")])
    assert dead is not None and trie.chat[dead] == 0.0 and trie.mass[dead] == 0.0
    assert trie.deficit[0] == pytest.approx(trie.prob[dead]) and trie.prob[dead] > 0.99
    assert trie.lookup([draw.token]) == run.path[-1]  # the run's path follows what it returned
    narrowed.advance(draw.token)
    run.finish([draw.token], completed=False)
    assert trie.chat[0] < 0.01  # the root learnt that the likely token has no future here


def test_asap_exact_fallback_records_every_refused_token(byte_vocab, compiler):
    sampler = ASAp()
    logits = torch.zeros(byte_vocab.logits_width)
    narrowed = NarrowedMatcher(compiler.compile_regex("[a-z]x").matcher(), lambda m, t: t == ord("q"), byte_vocab,
                               lazy_checks=0)
    run = sampler.start("k")
    assert run.draw(logits, narrowed, torch.Generator().manual_seed(0)).token == ord("q")
    trie = sampler.trie("k")
    refused = [t for t in range(ord("a"), ord("z") + 1) if t != ord("q")]
    assert all(trie.chat[trie.lookup([t])] == 0.0 for t in refused)
    words = allocate_token_bitmask(1, byte_vocab.logits_width)
    narrowed.fill_mask(words, 0)
    assert np.flatnonzero(unpack_bits(words[0], byte_vocab.logits_width)).tolist() == [ord("q")]


def test_narrowed_matcher_arguments(byte_vocab, compiler):
    base = compiler.compile_regex("a").matcher()
    with pytest.raises(TypeError, match="base must be a matcher"):
        NarrowedMatcher("matcher", no_letter_b, byte_vocab)
    with pytest.raises(TypeError, match="admits must be callable"):
        NarrowedMatcher(base, None, byte_vocab)
    with pytest.raises(TypeError, match="vocab must be a TokenVocabulary"):
        NarrowedMatcher(base, no_letter_b, "vocab")
    with pytest.raises(ValueError, match="lazy_checks must be >= 0"):
        NarrowedMatcher(base, no_letter_b, byte_vocab, lazy_checks=-1)
