"""Speculative decoding under a constraint (``engine.speculative``) is lossless.

Scripted target and draft models over a seven-token vocabulary and a grammar whose language is
small enough to enumerate: greedy speculative output equals greedy token-by-token decoding for
every draft source; sampled outputs follow the exact masked distribution of the target (χ² over
10,000 draws) with drafts that disagree with the target, propose invalid tokens, or are
deterministic; an invalid first draft token is trimmed before verification. The same holds with
the speculation length adapted per round (``k="auto"``, ``GoodputController``), with the draft
model's early stop (``stop_below``) and with unfiltered drafts (invalid tokens rejected by the
target instead of trimmed); the controller itself is tested with injected acceptance and costs.
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
from engine.speculative import GoodputController
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


def toy_vocabulary() -> TokenVocabulary:
    """The seven tokens every speculative test file shares (ids ``A`` … ``EOS``)."""
    pieces = [b"a", b"b", b"c", b"ab", b"ba", b"x", b""]
    return TokenVocabulary.from_bytes(pieces, eos_token_ids=[EOS], special_token_ids=[EOS])


@pytest.fixture(scope="module")
def vocab():
    return toy_vocabulary()


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


class ReducedDraft:
    """A scripted draft model with a reduced output vocabulary (``output_ids``, as ``HFCausalLM``
    has with ``output_ids=``): logits ``-inf`` outside it, so ``DraftModel`` draws over it alone."""

    def __init__(self, lm, ids):
        self.lm, self.output_ids = lm, torch.tensor(sorted(ids))
        self.outside = torch.ones(lm.logits_width, dtype=torch.bool)
        self.outside[self.output_ids] = False

    @property
    def logits_width(self):
        return self.lm.logits_width

    def next_logits(self, prefixes):
        return self.lm.next_logits(prefixes).masked_fill(self.outside, float("-inf"))


@pytest.mark.statistical
@pytest.mark.slow
def test_sampled_with_a_reduced_vocabulary_draft(vocab, compiled):
    """The draft cannot propose "b" or "ab" (outside its vocabulary) nor "x" (masked): the target
    still gets its exact distribution, top-p included."""
    draft, _ = scripted(vocab, seed=2)
    p, drafted, accepted, trimmed = _pvalue(vocab, compiled, DraftModel(ReducedDraft(draft, [A, C, BA, X, EOS])),
                                          SamplingParams(top_p=0.95), seed=3)
    assert 0 < accepted < drafted and trimmed == 0
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
    """Real KV-cached models: the target scores k+1 prefixes in one pass, the draft one at a time;
    a draft with a reduced output vocabulary (``output_ids``) proposes only from its subset."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from engine import HFCausalLM

    torch.manual_seed(5)
    small = GPT2LMHeadModel(GPT2Config(vocab_size=gpt2_vocab.logits_width, n_embd=16, n_layer=1, n_head=2,
                                       n_positions=256)).eval()
    target = HFCausalLM(tiny_gpt2)
    options = {"model": target, "tokenizer": gpt2_vocab, "temperature": 0, "max_tokens": 40,
               "regex": r"\[(true|false|null|[0-9]{1,3})(, [a-z]{1,5}){2,4}\]"}
    plain = generate("A list: [true, null, 7, abc]. Another: ", **options)
    reduced = DraftModel(HFCausalLM(small, output_ids=list(range(0, 50257, 3))))  # a third of the vocabulary
    for draft in (DraftModel(HFCausalLM(small)), DraftModel(HFCausalLM(tiny_gpt2)), "prompt_lookup", reduced):
        fast = generate("A list: [true, null, 7, abc]. Another: ", draft_model=draft, num_speculative_tokens=3,
                        **options)
        assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason


# --- adaptive speculation length ("auto"), early stop, unfiltered drafts --------------------------


def test_controller_expected_tokens_and_goodput():
    c = GoodputController(max_k=6, acceptance=0.5, target_s=1.0, draft_s=0.25)
    assert c.expected_tokens(0) == 1.0
    assert c.expected_tokens(2) == pytest.approx(1 + 0.5 + 0.25)
    assert GoodputController(acceptance=1.0).expected_tokens(3) == 4.0
    assert c.step_seconds(3) == pytest.approx(1.75)
    assert c.goodput(2) == pytest.approx(1.75 / 1.5)


def test_controller_picks_zero_when_drafts_are_rejected_and_max_when_accepted():
    costs = {"target_s": 0.010, "target_row_s": 0.001, "draft_s": 0.003}
    assert GoodputController(max_k=8, acceptance=0.02, **costs).best_k() == 0
    assert GoodputController(max_k=8, acceptance=0.99, **costs).best_k() == 8
    middle = GoodputController(max_k=8, acceptance=0.7, **costs).best_k()
    assert 0 < middle < 8
    # free drafts (prompt lookup) and free verification rows: draft as much as allowed
    assert GoodputController(max_k=5, acceptance=0.3, target_s=0.01, draft_s=0.0).best_k() == 5
    # drafts as dear as the target: never worth it below a = 0.5 (E[1] = 1 + a for twice the time)
    assert GoodputController(max_k=8, acceptance=0.45, target_s=1.0, draft_s=1.0).best_k() == 0


def test_controller_learns_acceptance_and_costs_from_rounds():
    c = GoodputController(max_k=8, acceptance=0.5, smoothing=0.2)
    assert c.choose() == c.start_k  # nothing measured yet
    for _ in range(30):  # every draft accepted; the target costs 10 ms + 1 ms per verified draft
        c.observe(proposed=4, accepted=4, rejected=False, draft_s=0.004, verified=4, verify_s=0.014)
        c.observe(proposed=1, accepted=1, rejected=False, draft_s=0.001, verified=1, verify_s=0.011)
    assert c.acceptance > 0.99
    assert c.draft_s == pytest.approx(0.001) and c.target_s == pytest.approx(0.010)
    assert c.target_row_s == pytest.approx(0.001)
    assert c.choose() == 8
    for _ in range(40):  # now every first draft is rejected
        c.observe(proposed=2, accepted=0, rejected=True, draft_s=0.002, verified=2, verify_s=0.012)
    assert c.acceptance < 0.01
    ks = [c.choose() for _ in range(2 * (c.probe_every + 1))]
    assert ks.count(1) == 2 and set(ks) == {0, 1}  # a one-token probe after probe_every idle rounds
    frozen = GoodputController(target_s=1.0, draft_s=0.5, measure_costs=False)
    frozen.observe(proposed=1, accepted=1, rejected=False, draft_s=9.0, verified=1, verify_s=9.0)
    assert (frozen.target_s, frozen.draft_s) == (1.0, 0.5) and frozen.acceptance > 0.5


def test_controller_checks_its_fields():
    with pytest.raises(ValueError, match="max_k"):
        GoodputController(max_k=-1)
    with pytest.raises(ValueError, match="acceptance"):
        GoodputController(acceptance=1.5)
    with pytest.raises(ValueError, match="draft_s"):
        GoodputController(draft_s=-1.0)
    with pytest.raises(ValueError, match="stop_below"):
        DraftModel(ScriptedLM(7, [{}]), stop_below=1.0)


@pytest.mark.parametrize("name", ["draft_model", "draft_model_unconstrained", "prompt_lookup", "forced"])
@pytest.mark.parametrize("seed", [1, 4, 5])
def test_greedy_auto_equals_token_by_token(vocab, compiled, name, seed):
    target, _ = scripted(vocab, seed=seed)
    expected = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=16)
    for k in ("auto", GoodputController(max_k=3, acceptance=0.9, target_s=1.0, draft_s=0.2)):
        out = speculative_decode(target, sources(vocab)[name], vocab, PROMPT, compiled.matcher(), k=k, max_k=5,
                                 max_tokens=16, params=SamplingParams(temperature=0))
        assert out.token_ids == expected.token_ids and out.finish_reason == expected.finish_reason == "stop"
        assert len(out.k_per_call) == out.target_calls and max(out.k_per_call) <= 5


def test_greedy_early_stop_and_unfiltered_equal_token_by_token(vocab, compiled):
    target, _ = scripted(vocab, seed=4)
    expected = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=16)
    draft = DraftModel(scripted(vocab, seed=2)[0], stop_below=0.5)
    out = speculative_decode(target, draft, vocab, PROMPT, compiled.matcher(), k=4, max_tokens=16,
                             params=SamplingParams(temperature=0))
    assert out.token_ids == expected.token_ids
    wrong, _ = scripted(vocab, seed=3, bias={X: 50.0})  # always "x": invalid
    for source in (DraftModel(wrong, constrained=False), PromptLookup()):
        kept = speculative_decode(target, source, vocab, PROMPT, compiled.matcher(), k=4, max_tokens=16,
                                  params=SamplingParams(temperature=0))
        sent = speculative_decode(target, source, vocab, PROMPT, compiled.matcher(), k=4, max_tokens=16,
                                  params=SamplingParams(temperature=0), filter_drafts=False)
        assert kept.token_ids == sent.token_ids == expected.token_ids
        assert sent.invalid_tokens > 0 and sent.trimmed > 0
        # unfiltered, the invalid tokens reach the target and are rejected there: the same rounds,
        # with the invalid tokens (and what followed them) as extra verified rows
        assert sent.drafted - kept.drafted == sent.invalid_tokens == kept.invalid_tokens
        assert (sent.accepted, sent.target_calls) == (kept.accepted, kept.target_calls)


def test_generate_accepts_auto_and_checks_the_maximum(vocab):
    target, _ = scripted(vocab, seed=4)
    plain = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0)
    fast = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0,
                    draft_model=DraftModel(scripted(vocab, seed=2)[0]), num_speculative_tokens="auto",
                    max_speculative_tokens=3)
    assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, draft_model="prompt_lookup",
                 num_speculative_tokens="fast")
    with pytest.raises(ValueError, match="max_speculative_tokens"):
        generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, draft_model="prompt_lookup",
                 num_speculative_tokens="auto", max_speculative_tokens=0)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        speculative_decode(target, ForcedTokens(), vocab, PROMPT, Compiler(vocab).compile_regex(REGEX).matcher(),
                           k="fast")


def _adaptive_pvalue(vocab, compiled, make_source, params, seed, filter_drafts=True):
    """χ² p-value of sampled outputs when each sequence gets a fresh controller whose k follows
    the measured acceptance (costs fixed, so the choices are reproducible), and the k used."""
    target, target_fn = scripted(vocab, seed=1)
    exact = exact_masked(target_fn, compiled.matcher(), vocab.logits_width, params=params)
    generator = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    ks: Counter = Counter()
    for _ in range(N):
        controller = GoodputController(max_k=4, acceptance=0.5, target_s=1.0, draft_s=0.4, smoothing=0.3,
                                       measure_costs=False, probe_every=2)
        out = speculative_decode(target, make_source(), vocab, PROMPT, compiled.matcher(), k=controller,
                                 max_tokens=16, params=params, generator=generator, filter_drafts=filter_drafts)
        assert out.finish_reason == "stop"
        counts[tuple(out.token_ids) + (EOS,)] += 1
        ks.update(out.k_per_call)
    return chisquare_pvalue(counts, exact), ks


@pytest.mark.statistical
@pytest.mark.slow
def test_sampled_with_adaptive_k_is_the_target_distribution(vocab, compiled):
    draft, _ = scripted(vocab, seed=2)
    p, ks = _adaptive_pvalue(vocab, compiled, lambda: DraftModel(draft), SamplingParams(), seed=3)
    assert ks[0] > 0 and ks[1] > 0 and max(ks) >= 2  # k really changed along the sequences
    assert p > 0.01


@pytest.mark.statistical
@pytest.mark.slow
def test_sampled_with_early_stop(vocab, compiled):
    draft, _ = scripted(vocab, seed=2)
    p, drafted, accepted, _ = _pvalue(vocab, compiled, DraftModel(draft, stop_below=0.3), SamplingParams(), seed=4)
    assert 0 < accepted < drafted
    assert p > 0.01


@pytest.mark.statistical
@pytest.mark.slow
def test_sampled_with_unfiltered_drafts_and_adaptive_k(vocab, compiled):
    bad, _ = scripted(vocab, seed=3, bias={X: 1.5})  # often drafts "x": sent to the target, rejected there
    p, _ = _adaptive_pvalue(vocab, compiled, lambda: DraftModel(bad, constrained=False, stop_below=0.2),
                            SamplingParams(temperature=0.8), seed=5, filter_drafts=False)
    assert p > 0.01


# --- budget-aware closing --------------------------------------------------------------------------


def _closing(vocab, matcher, budget: int):
    from engine.closing import BudgetClosing, ClosingPlanner

    return BudgetClosing(ClosingPlanner(vocab), matcher.num_consumed + budget)


@pytest.mark.parametrize("name", ["draft_model", "draft_model_unconstrained", "prompt_lookup", "forced"])
def test_greedy_with_closing_equals_token_by_token(vocab, compiled, name):
    """A target that prefers a/b runs out of room for "cc" unless closing steers it: speculative
    rounds must steer exactly where token-by-token decoding does."""
    steered = 0
    for seed in (1, 4):
        target, _ = scripted(vocab, seed=seed, bias={A: 2.5, B: 2.5, AB: 2.5, BA: 2.5})
        for budget in (4, 5, 6):
            expected = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0,
                                max_tokens=budget)
            matcher = compiled.matcher()
            out = speculative_decode(target, sources(vocab)[name], vocab, PROMPT, matcher, k=3, max_tokens=budget,
                                     params=SamplingParams(temperature=0), closing=_closing(vocab, matcher, budget))
            assert out.token_ids == expected.token_ids, (seed, budget)
            assert out.finish_reason == expected.finish_reason == "stop"
            steered += out.budget_steered
    assert steered > 0  # the budget did bind


def test_sampled_with_closing_is_the_narrowed_distribution(vocab, compiled):
    budget = 4
    target, target_fn = scripted(vocab, seed=1, bias={A: 1.5, B: 1.5})
    narrowed = _closing(vocab, compiled.matcher(), budget).narrow(compiled.matcher())
    exact = exact_masked(target_fn, narrowed, vocab.logits_width, max_tokens=budget)
    draft, _ = scripted(vocab, seed=2)
    generator = torch.Generator().manual_seed(7)
    counts: Counter = Counter()
    steered = 0
    for _ in range(3000):
        matcher = compiled.matcher()
        out = speculative_decode(target, DraftModel(draft), vocab, PROMPT, matcher, k=3, max_tokens=budget,
                                 generator=generator, closing=_closing(vocab, matcher, budget))
        assert out.finish_reason == "stop"
        counts[tuple(out.token_ids) + (EOS,)] += 1
        steered += out.budget_steered
    assert steered > 0
    assert set(counts) <= set(exact)
    assert chisquare_pvalue(counts, exact) > 1e-3


def test_generate_applies_closing_on_the_speculative_path(vocab):
    target, _ = scripted(vocab, seed=4, bias={A: 2.5, B: 2.5, AB: 2.5, BA: 2.5})
    draft = scripted(vocab, seed=2)[0]
    plain = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=5)
    spec = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=5,
                    draft_model=draft)
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "stop"
    assert spec.budget_steered > 0
    off = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=5,
                   draft_model=draft, budget_closing=False)
    assert off.finish_reason == "length" and off.budget_steered == 0
