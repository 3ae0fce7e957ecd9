"""State a sampler learns about a (prompt, grammar) pair is keyed by content, never by ``id()``.

``generate`` without ``compiler=`` compiles a new ``CompiledGrammar`` every call, so an ASAp
instance reused across such calls must still find its trie (else it never converges), and a
grammar collected after one call must not hand its state to another that reuses its ``id()``.
"""

from __future__ import annotations

import gc
import importlib

import pytest
import torch

from engine import ScriptedLM, generate
from engine.generate import _sampler_key
from grammars import Compiler, TokenVocabulary
from samplers import ASAp

A, B, EOS = 0, 1, 2


@pytest.fixture(scope="module")
def ab_vocab():
    return TokenVocabulary.from_bytes([b"a", b"b", b""], eos_token_ids=[EOS])


def unlikely_b_after_a(prefix: tuple[int, ...]) -> torch.Tensor:
    """Uniform over {a, b, EOS}, except that ``b`` after ``a`` has probability ~6e-5.

    Under ``(ab|b)`` the grammar-conditioned model gives ``ab`` ~6e-5 against ``b``; locally
    masked sampling (GCD, and ASAp before it learnt anything) draws ``a`` first half the time.
    """
    logits = torch.zeros(3)
    if prefix and prefix[-1] == A:
        logits[B] = -9.0
    return logits


def test_plain_calls_reuse_one_trie_and_converge(ab_vocab):
    lm = ScriptedLM(3, unlikely_b_after_a)
    sampler = ASAp()
    texts = [generate([EOS], regex="(ab|b)", model=lm, tokenizer=ab_vocab, sampler=sampler, seed=seed).text
             for seed in range(40)]
    assert set(texts) <= {"ab", "b"}
    assert len(sampler.keys()) == 1  # forty compilations, one (prompt, grammar) pair
    # One visit to "a" teaches the trie that its future is ~6e-5, so at most the first few draws
    # take it; a trie per call would draw it ~20 times (Binomial(40, 1/2) <= 3: p ~ 1e-8).
    assert texts.count("ab") <= 3, texts


def test_grammars_at_one_address_never_share_state(ab_vocab, monkeypatch):
    """A collected grammar hands its ``id()`` on; here every object gets the same one."""
    module = importlib.import_module("engine.generate")  # (the package's ``generate`` is the function)
    monkeypatch.setattr(module, "id", lambda obj: 0, raising=False)
    lm = ScriptedLM(3, unlikely_b_after_a)
    sampler = ASAp()
    for regex in ("(ab|b)", "a|b", "(ab|b)"):
        generate([EOS], regex=regex, model=lm, tokenizer=ab_vocab, sampler=sampler, seed=0)
    assert len(sampler.keys()) == 2


def test_keys_follow_content_not_identity(ab_vocab):
    first = Compiler(ab_vocab).compile_regex("(ab|b)")
    key = _sampler_key([EOS], first)
    del first
    gc.collect()
    assert _sampler_key([EOS], Compiler(ab_vocab).compile_regex("(ab|b)")) == key  # recompiled: same key
    other = Compiler(ab_vocab).compile_regex("a|b")
    assert _sampler_key([EOS], other) != key
    assert _sampler_key([A], other) != _sampler_key([EOS], other)  # the prompt is part of it
    assert _sampler_key([EOS], None) != _sampler_key([EOS], other)  # unconstrained
