"""Speculative decoding under a constraint (``engine.speculative``) is lossless.

Scripted target and draft models over a seven-token vocabulary and a grammar whose language is
small enough to enumerate: greedy speculative output equals greedy token-by-token decoding for
every draft source; sampled outputs follow the exact masked distribution of the target (χ² over
10,000 draws) with drafts that disagree with the target, propose invalid tokens, or are
deterministic; an invalid first draft token is trimmed before verification.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from engine import (
    DraftModel,
    ForcedTokens,
    PromptLookup,
    ScriptedLM,
    generate,
    speculative_decode,
)
from grammars import Compiler, TokenVocabulary
from samplers import SamplingParams
from samplers.enumerate import (
    chisquare_pvalue,
    exact_masked,
    hashed_logits_fn,
    language,
)

REGEX = r"[ab]{1,3}cc[ab]?"  # a forced "c" after the first one; 72 token sequences
A, B, C, AB, BA, X, EOS = range(7)
PROMPT = [X, A, B, C, C, A, B, X]  # "x" is never allowed: prompt lookup proposes it


@pytest.fixture(scope="module")
def vocab():
    pieces = [b"a", b"b", b"c", b"ab", b"ba", b"x", b""]
    return TokenVocabulary.from_bytes(pieces, eos_token_ids=[EOS], special_token_ids=[EOS])


@pytest.fixture(scope="module")
def compiled(vocab):
    return Compiler(vocab).compile_regex(REGEX)


def scripted(vocab, seed: int, *, bias: dict[int, float] | None = None):
    """A ScriptedLM whose logits are a hashed function of the generated tokens (prompt cut off),
    and that function, for exact enumeration."""
    extra = None
    if bias:
        extra = torch.zeros(vocab.logits_width)
        for token, value in bias.items():
            extra[token] = value
    fn = hashed_logits_fn(vocab.logits_width, seed=seed, scale=2.0, bias=extra)
    return ScriptedLM(vocab.logits_width, lambda prefix: fn(prefix[len(PROMPT):])), fn


def sources(vocab):
    draft, _ = scripted(vocab, seed=2)
    bad, _ = scripted(vocab, seed=3, bias={X: 4.0})
    return {
        "draft_model": DraftModel(draft),
        "draft_model_unconstrained": DraftModel(bad, constrained=False),
        "prompt_lookup": PromptLookup(ngram=3),
        "forced": ForcedTokens(),
    }


@pytest.mark.parametrize("name", ["draft_model", "draft_model_unconstrained", "prompt_lookup", "forced"])
@pytest.mark.parametrize("seed", [1, 4, 5])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_equals_token_by_token(vocab, compiled, name, seed, k):
    target, _ = scripted(vocab, seed=seed)
    expected = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=16)
    out = speculative_decode(target, sources(vocab)[name], vocab, PROMPT, compiled.matcher(), k=k, max_tokens=16,
                             params=SamplingParams(temperature=0))
    assert out.token_ids == expected.token_ids
    assert out.finish_reason == expected.finish_reason == "stop"
    assert out.text.decode() == expected.text
    # every token committed by a target call, + EOS unless the grammar ended the text (only EOS left)
    assert sum(out.accepted_per_call) - len(out.token_ids) in (0, 1)
    assert out.target_calls == len(out.accepted_per_call)


def test_greedy_respects_the_budget(vocab, compiled):
    target, _ = scripted(vocab, seed=1, bias={A: 3.0, B: 3.0})
    expected = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=2,
                        budget_closing=False)
    out = speculative_decode(target, PromptLookup(), vocab, PROMPT, compiled.matcher(), k=4, max_tokens=2,
                             params=SamplingParams(temperature=0))
    assert out.token_ids == expected.token_ids and len(out.token_ids) == 2
    assert out.finish_reason == expected.finish_reason == "length"


def test_forced_drafts_are_free(vocab, compiled):
    target, _ = scripted(vocab, seed=1)
    out = speculative_decode(target, ForcedTokens(), vocab, PROMPT, compiled.matcher(), k=4, max_tokens=16,
                             params=SamplingParams(temperature=0))
    assert out.forced_tokens >= 1  # the second "c"
    plain = generate(PROMPT, model=scripted(vocab, seed=1)[0], tokenizer=vocab, regex=REGEX, temperature=0)
    assert out.target_calls <= len(plain.per_token_s) + 1


def test_invalid_first_draft_token_is_trimmed(vocab, compiled):
    target, _ = scripted(vocab, seed=1)
    wrong, _ = scripted(vocab, seed=3, bias={X: 50.0})  # always drafts "x", never allowed
    draft = DraftModel(wrong, constrained=False)
    out = speculative_decode(target, draft, vocab, PROMPT, compiled.matcher(), k=4, max_tokens=16,
                             params=SamplingParams(temperature=0))
    assert draft.calls > 0 and out.trimmed == draft.calls  # every model draft was "x", trimmed
    assert out.drafted == out.forced_tokens  # no model-drafted token reached verification
    assert out.accepted == out.forced_tokens
    expected = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0)
    assert out.token_ids == expected.token_ids


def test_prompt_lookup_copies_ngrams():
    look = PromptLookup(ngram=2)
    proposed = look.propose([1, 2, 3, 4, 1, 2], None, 3, SamplingParams(), None, None)
    assert [d.token for d in proposed] == [3, 4, 1]
    assert all(d.q is None for d in proposed)
    assert look.propose([1, 2, 3], None, 3, SamplingParams(), None, None) == []
    with pytest.raises(ValueError):
        PromptLookup(ngram=0)


def test_bad_arguments(vocab, compiled):
    target, _ = scripted(vocab, seed=1)
    with pytest.raises(ValueError):
        speculative_decode(target, ForcedTokens(), vocab, PROMPT, compiled.matcher(), k=-1)
    with pytest.raises(TypeError):
        speculative_decode(target, object(), vocab, PROMPT, compiled.matcher(), k=2)


# --- sampled outputs: the exact masked distribution of the target ----------------------------------

N = 10_000


def _pvalue(vocab, compiled, source, params, seed=0):
    target, target_fn = scripted(vocab, seed=1)
    exact = exact_masked(target_fn, compiled.matcher(), vocab.logits_width, params=params)
    assert len(language(compiled.matcher(), vocab.logits_width)) == 72
    generator = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    drafted = accepted = trimmed = 0
    for _ in range(N):
        out = speculative_decode(target, source, vocab, PROMPT, compiled.matcher(), k=3, max_tokens=16,
                                 params=params, generator=generator)
        assert out.finish_reason == "stop"
        counts[tuple(out.token_ids) + (EOS,)] += 1
        drafted += out.drafted - out.forced_tokens
        accepted += out.accepted - out.forced_tokens
        trimmed += out.trimmed
    return chisquare_pvalue(counts, exact), drafted, accepted, trimmed


@pytest.mark.statistical
@pytest.mark.slow
def test_sampled_with_a_disagreeing_draft_model(vocab, compiled):
    draft, _ = scripted(vocab, seed=2)
    p, drafted, accepted, trimmed = _pvalue(vocab, compiled, DraftModel(draft), SamplingParams())
    assert 0 < accepted < drafted  # rejections happen
    assert trimmed == 0  # drafted under the constraint: always valid
    assert p > 0.01


@pytest.mark.statistical
@pytest.mark.slow
def test_sampled_with_invalid_proposals_filtered(vocab, compiled):
    draft, _ = scripted(vocab, seed=3, bias={X: 1.5})  # often drafts "x": trimmed
    p, drafted, accepted, trimmed = _pvalue(vocab, compiled, DraftModel(draft, constrained=False),
                                          SamplingParams(temperature=0.8, top_k=4), seed=1)
    assert 0 < accepted < drafted and trimmed > 0
    assert p > 0.01


@pytest.mark.statistical
@pytest.mark.slow
def test_sampled_with_prompt_lookup(vocab, compiled):
    p, drafted, accepted, trimmed = _pvalue(vocab, compiled, PromptLookup(), SamplingParams(top_p=0.9), seed=2)
    assert 0 < accepted < drafted and trimmed > 0
    assert p > 0.01


# --- through generate() ---------------------------------------------------------------------------


@pytest.mark.parametrize("draft", ["prompt_lookup", "forced", "model", "unconstrained"])
def test_generate_with_a_draft_model_is_greedy_identical(vocab, draft):
    target, _ = scripted(vocab, seed=4)
    spec = {"model": scripted(vocab, seed=2)[0], "unconstrained": DraftModel(scripted(vocab, seed=2)[0], False)}
    plain = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0)
    fast = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0,
                    draft_model=spec.get(draft, draft), num_speculative_tokens=3)
    assert fast.token_ids == plain.token_ids and fast.text == plain.text
    assert fast.finish_reason == plain.finish_reason == "stop"


def test_generate_sampled_with_a_draft_model_is_seeded(vocab):
    target, _ = scripted(vocab, seed=4)
    runs = [generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, seed=7, draft_model="prompt_lookup")
            for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids and runs[0].finish_reason == "stop"


@pytest.mark.parametrize("sampler", ["asap", "awrs", "smc"])
def test_generate_refuses_samplers_that_reweight_sequences(vocab, sampler):
    target, _ = scripted(vocab, seed=4)
    with pytest.raises(ValueError, match="masked sampler only"):
        generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, sampler=sampler, draft_model="prompt_lookup")


def test_generate_checks_speculative_options(vocab):
    target, _ = scripted(vocab, seed=4)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, draft_model="prompt_lookup",
                 num_speculative_tokens=0)
    with pytest.raises(ValueError, match="stop="):
        generate(PROMPT, model=target, tokenizer=vocab, stop=["c"], draft_model="prompt_lookup")
    with pytest.raises(TypeError, match="draft_model"):
        generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, draft_model=3.5)


def test_hf_target_and_draft_greedy_identical(tiny_gpt2, gpt2_vocab):
    """Real KV-cached models: the target scores k+1 prefixes per call, the draft one at a time."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from engine import HFCausalLM

    torch.manual_seed(5)
    small = GPT2LMHeadModel(GPT2Config(vocab_size=gpt2_vocab.logits_width, n_embd=16, n_layer=1, n_head=2,
                                       n_positions=256)).eval()
    target = HFCausalLM(tiny_gpt2)
    options = {"model": target, "tokenizer": gpt2_vocab, "temperature": 0, "max_tokens": 40,
               "regex": r"\[(true|false|null|[0-9]{1,3})(, [a-z]{1,5}){2,4}\]"}
    plain = generate("A list: [true, null, 7, abc]. Another: ", **options)
    for draft in (DraftModel(HFCausalLM(small)), DraftModel(HFCausalLM(tiny_gpt2)), "prompt_lookup"):
        fast = generate("A list: [true, null, 7, abc]. Another: ", draft_model=draft, num_speculative_tokens=3,
                        **options)
        assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason
