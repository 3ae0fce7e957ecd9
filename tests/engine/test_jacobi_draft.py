"""Jacobi / lookahead drafting (``engine.jacobi``): the target drafts for itself, losslessly.

Greedy outputs equal token-by-token decoding on the toy grammar of ``test_speculative`` and
through ``generate(draft_model="jacobi")``; sampled outputs follow the exact masked distribution
(χ² over 10,000 draws). The fixed-point guesses come from the rejected branch of the last
verification, the pool from the target's predictions and the text, and on a repetitive target
they commit several tokens per target call. The ``observe_verification`` hook also reaches
chain sources.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_speculative import EOS, PROMPT, REGEX, A, B, C, X, scripted, toy_vocabulary

from engine import PromptLookup, ScriptedLM, generate, speculative_decode
from engine.jacobi import JacobiDraft
from engine.spec_tree import TokenTree, Verification
from engine.speculative import resolve_draft
from grammars import Compiler
from samplers import SamplingParams
from samplers.enumerate import chisquare_pvalue, exact_masked

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def vocab():
    return toy_vocabulary()


@pytest.fixture(scope="module")
def compiled(vocab):
    return Compiler(vocab).compile_regex(REGEX)


@pytest.mark.parametrize("seed", [1, 4, 5])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_jacobi_equals_token_by_token(vocab, compiled, seed, k):
    target, _ = scripted(vocab, seed=seed)
    expected = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=16)
    out = speculative_decode(target, JacobiDraft(), vocab, PROMPT, compiled.matcher(), k=k, max_tokens=16,
                             params=GREEDY)
    assert out.token_ids == expected.token_ids and out.finish_reason == expected.finish_reason == "stop"
    assert sum(out.accepted_per_call) - len(out.token_ids) in (0, 1)


@pytest.mark.parametrize("name", ["jacobi", "lookahead"])
def test_generate_with_jacobi(vocab, name):
    target, _ = scripted(vocab, seed=4)
    assert isinstance(resolve_draft(name), JacobiDraft) and resolve_draft(name) is not resolve_draft(name)
    plain = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0)
    fast = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, draft_model=name,
                    num_speculative_tokens="auto")
    assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason


def test_guesses_follow_the_rejected_branch():
    width = 7
    source = JacobiDraft(ngram=2)
    tree = TokenTree()
    a = tree.add(A)  # accepted
    b = tree.add(B, a)  # rejected: the target's predictions below it are one token off
    c = tree.add(C, b)
    logits = {node: torch.nn.functional.one_hot(torch.tensor(t), width).float()
              for node, t in ((-1, A), (a, X), (b, C), (c, A))}
    source.observe_verification(Verification([X], tree, logits, [a], [A, X]))
    assert source._guesses == [C, A]  # predicted after B, after B C: guesses after A X
    # the pool holds the target's argmax after every verified position, keyed by its last token
    assert source.candidates([B]) == [C] and source.candidates([A]) == [X]
    matcher = Compiler(toy_vocabulary()).compile_regex("[abcx]*").matcher()
    proposed = source.propose_tree([X, A, X], matcher.fork(), 2, GREEDY, None, None)
    assert proposed.nodes[proposed.main_path()[0]].token == C  # the first guess leads
    assert source.propose_tree([X, A], matcher.fork(), 1, GREEDY, None, None).nodes[0].token == X  # no guess: the pool
    with pytest.raises(ValueError, match="ngram"):
        JacobiDraft(ngram=1)


def test_pool_indexes_the_text_like_prompt_lookup(vocab):
    source = JacobiDraft(ngram=3, width=1)
    matcher = Compiler(vocab).compile_regex("[abcx]*").matcher()
    tree = source.propose_tree([A, B, C, X, A, B], matcher.fork(), 3, GREEDY, None, vocab)
    assert [tree.nodes[j].token for j in tree.main_path()] == [C, X, A]
    drafts = JacobiDraft(width=1).propose([A, B, C, X, A, B], matcher.fork(), 2, GREEDY, None, vocab)
    assert [d.token for d in drafts] == [C, X] and all(d.q is None for d in drafts)


def test_jacobi_commits_several_tokens_per_call_on_a_repetitive_target(vocab):
    """A target that repeats "ab" and ends after about 20 tokens: the pool learns the cycle."""

    def logits(prefix):
        out = prefix[len(PROMPT):]
        if len(out) >= 20:
            return {EOS: 10.0, C: 5.0}
        return {B if out and out[-1] == A else A: 10.0}

    regex = "(ab|a|b)*c?"
    target = ScriptedLM(vocab.logits_width, logits)
    plain = generate(PROMPT, model=target, tokenizer=vocab, regex=regex, temperature=0, max_tokens=40)
    out = speculative_decode(target, JacobiDraft(), vocab, PROMPT, Compiler(vocab).compile_regex(regex).matcher(),
                             k=4, max_tokens=40, params=GREEDY)
    assert out.token_ids == plain.token_ids and len(out.token_ids) >= 20
    assert out.tokens_per_call > 2.5


class Recording(PromptLookup):
    """A chain source that records what the target saw."""

    def __init__(self):
        super().__init__(ngram=2)
        self.seen: list[Verification] = []

    def observe_verification(self, seen):
        self.seen.append(seen)


def test_the_hook_reaches_chain_sources(vocab, compiled):
    target, _ = scripted(vocab, seed=4)
    source = Recording()
    out = speculative_decode(target, source, vocab, PROMPT, compiled.matcher(), k=3, max_tokens=16, params=GREEDY)
    assert len(source.seen) == out.target_calls
    # EOS is committed by a call unless only EOS was left (then no call)
    assert [t for v in source.seen for t in v.committed] in (out.token_ids, out.token_ids + [EOS])
    for v in source.seen:
        assert len(v.accepted) in (len(v.committed), len(v.committed) - 1)
        assert all(v.tree.nodes[j].token == t for j, t in zip(v.accepted, v.committed))
        assert all(row.shape == (vocab.logits_width,) for row in v.logits.values())
        # a forced draft is accepted without reading the logits before it: those are not scored
        assert all(j + 1 == len(v.tree) or not v.tree.nodes[j + 1].forced for j in v.logits)


@pytest.mark.statistical
@pytest.mark.slow
@pytest.mark.bench  # 10,000 sequences: minutes on a CPU (run with -m statistical)
def test_sampled_jacobi_is_the_target_distribution(vocab, compiled):
    params = SamplingParams(temperature=0.9)
    target, target_fn = scripted(vocab, seed=1)
    exact = exact_masked(target_fn, compiled.matcher(), vocab.logits_width, params=params)
    generator = torch.Generator().manual_seed(3)
    counts: Counter = Counter()
    drafted = accepted = 0
    for _ in range(10_000):
        out = speculative_decode(target, JacobiDraft(), vocab, PROMPT, compiled.matcher(), k=3, max_tokens=16,
                                 params=params, generator=generator)
        counts[tuple(out.token_ids) + (EOS,)] += 1
        drafted += out.drafted - out.forced_tokens
        accepted += out.accepted - out.forced_tokens
    assert 0 < accepted < drafted
    assert chisquare_pvalue(counts, exact) > 0.01
