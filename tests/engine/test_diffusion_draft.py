"""The diffusion drafter (``engine.diffusion_draft.DiffusionDraft``) keeps speculative decoding lossless.

A scripted target and a scripted masked-diffusion model (one column wider than the vocabulary: the
mask token) over a seven-token vocabulary. Greedy speculative output equals greedy token-by-token
decoding on both paths — DINGO over the token DFA (regular constraints, the DFA state found from a
plain ``Matcher`` or read from a ``DFAMatcher``) and the beam search over forked matchers (a
context-free grammar, or no DFA at hand); sampled outputs follow the exact masked distribution of
the target (χ² against exact enumeration) on both. Every draft passes the matcher, and the drafts
are the most probable valid paths (checked by brute force). A random-weights ModernBERT over the
GPT-2 vocabulary drafts for a random GPT-2 target through ``generate``.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from test_speculative import EOS, PROMPT, REGEX, A, toy_vocabulary

from engine import ScriptedLM, generate, speculative_decode
from engine.diffusion_draft import DiffusionDraft
from engine.diffusion_lm import ScriptedDiffusionLM
from grammars import Compiler
from samplers import SamplingParams
from samplers.enumerate import chisquare_pvalue, exact_masked, hashed_logits_fn
from samplers.masked import masked_distribution

MASK = 7  # the diffusion model's extra column
DYCK = 'root ::= d "c"\nd ::= ("a" d "b")*'  # balanced a/b, then "c": context-free
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def vocab():
    return toy_vocabulary()


@pytest.fixture(scope="module")
def regular(vocab):
    grammar = Compiler(vocab).compile_regex(REGEX)
    assert grammar.is_regular
    return grammar


@pytest.fixture(scope="module")
def dyck(vocab):
    grammar = Compiler(vocab).compile_gbnf(DYCK)
    assert not grammar.is_regular
    return grammar


def target(vocab, seed: int):
    """A ScriptedLM of the generated tokens (prompt cut off) and its logits function."""
    fn = hashed_logits_fn(vocab.logits_width, seed=seed, scale=2.0)
    return ScriptedLM(vocab.logits_width, lambda prefix: fn(prefix[len(PROMPT):])), fn


def diffusion(seed: int, *, mask_bias: float = 0.0) -> ScriptedDiffusionLM:
    """A masked position ``j``'s logits a hashed function of the canvas before it (the mask column
    included); the positions before the first mask, which a draft never reads, score zeros."""
    fn = hashed_logits_fn(MASK + 1, seed=seed, scale=2.0)

    def script(canvas):
        rows = torch.zeros(len(canvas), MASK + 1)
        first = canvas.index(MASK) if MASK in canvas else len(canvas)
        for j in range(first, len(canvas)):
            rows[j] = fn(canvas[:j])
        rows[:, MASK] += mask_bias
        return rows

    return ScriptedDiffusionLM(MASK + 1, MASK, script)


# --- greedy: identical to token-by-token decoding -----------------------------------------------


@pytest.mark.parametrize("path", ["dingo", "dfa_matcher", "search", "beam"])
@pytest.mark.parametrize("seed", [1, 4, 5])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_regular_equals_token_by_token(vocab, regular, path, seed, k):
    lm, _ = target(vocab, seed)
    expected = generate(PROMPT, model=lm, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=16)
    draft = DiffusionDraft(diffusion(seed + 10), block=4, beam=3 if path == "beam" else 1,
                           grammar=regular if path == "dingo" else None)
    matcher = regular.as_dfa().matcher() if path == "dfa_matcher" else regular.matcher()
    out = speculative_decode(lm, draft, vocab, PROMPT, matcher, k=k, max_tokens=16, params=GREEDY)
    assert out.token_ids == expected.token_ids and out.finish_reason == expected.finish_reason == "stop"
    assert draft.calls > 0
    if path in ("dingo", "dfa_matcher"):
        assert draft.dingo_drafts == draft.calls and draft.searched_drafts == 0
    else:
        assert draft.searched_drafts == draft.calls and draft.dingo_drafts == 0


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_context_free_equals_token_by_token(vocab, dyck, seed, beam):
    lm, _ = target(vocab, seed)
    expected = generate(PROMPT, model=lm, tokenizer=vocab, grammar=DYCK, temperature=0, max_tokens=12,
                        budget_closing=False)
    draft = DiffusionDraft(diffusion(seed + 20), block=6, beam=beam, grammar=dyck)  # not regular: searched
    out = speculative_decode(lm, draft, vocab, PROMPT, dyck.matcher(), k=4, max_tokens=12, params=GREEDY)
    assert out.token_ids == expected.token_ids and out.finish_reason == expected.finish_reason
    assert draft.searched_drafts == draft.calls > 0 and draft.dingo_drafts == 0


def test_a_grammar_for_another_constraint_falls_back_to_the_search(vocab, regular):
    lm, _ = target(vocab, 1)
    other = Compiler(vocab).compile_regex(r"c[ab]{2,5}")
    draft = DiffusionDraft(diffusion(3), grammar=other)
    out = speculative_decode(lm, draft, vocab, PROMPT, regular.matcher(), k=3, max_tokens=16, params=GREEDY)
    expected = generate(PROMPT, model=lm, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=16)
    assert out.token_ids == expected.token_ids
    assert draft.searched_drafts > 0  # the walk of "other"'s DFA disagrees with the matcher


def test_through_generate(vocab, regular):
    lm, _ = target(vocab, 4)
    plain = generate(PROMPT, model=lm, tokenizer=vocab, regex=REGEX, temperature=0)
    draft = DiffusionDraft(diffusion(2)).with_grammar(regular)
    fast = generate(PROMPT, model=lm, tokenizer=vocab, regex=REGEX, temperature=0, draft_model=draft,
                    num_speculative_tokens=3)
    assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason == "stop"
    assert draft.dingo_drafts > 0


# --- the drafts: valid, and the most probable valid paths ---------------------------------------


def _prefixes(grammar, vocab, depth=4, limit=40):
    """Valid prefixes of up to ``depth`` tokens, breadth first (the states a draft starts from)."""
    found, frontier = [()], [((), grammar.matcher())]
    while frontier and len(found) < limit:
        prefix, m = frontier.pop(0)
        for t in range(vocab.logits_width):
            if t != EOS and len(prefix) < depth and m.allows(t):
                child = m.fork()
                child.advance(t)
                found.append(prefix + (t,))
                frontier.append((prefix + (t,), child))
    return found[:limit]


def _best_path(log_probs, matcher, eos):
    """Brute force: the most probable valid path through the rows (after EOS, EOS scores)."""
    best, best_tokens = -math.inf, None
    k, width = log_probs.shape
    for tokens in itertools.product(range(width), repeat=k):
        m, score, path = matcher.fork(), 0.0, []
        for i, t in enumerate(tokens):
            if m.is_terminated():
                if t != eos:
                    break
            elif not m.allows(t):
                break
            else:
                m.advance(t)
                path.append(t)
            score += float(log_probs[i, t])
        else:
            if score > best:
                best, best_tokens = score, path
    return best, best_tokens


@pytest.mark.parametrize("kind", ["regular", "dyck"])
def test_every_draft_passes_the_matcher_and_is_the_best_valid_path(vocab, regular, dyck, kind):
    grammar = regular if kind == "regular" else dyck
    lm = diffusion(7)
    exact = DiffusionDraft(lm, block=3, beam=400, grammar=grammar)  # DINGO, or a beam wide enough to be exact
    greedy = DiffusionDraft(lm, block=3, beam=1)
    checked = 0
    for prefix in _prefixes(grammar, vocab):
        matcher = grammar.matcher()
        for t in prefix:
            matcher.advance(t)
        context = PROMPT + list(prefix)
        for source in (exact, greedy):
            drafts = source.propose(context, matcher.fork(), 3, GREEDY, None, vocab)
            assert 1 <= len(drafts) <= 3 and all(d.q is None for d in drafts)
            walk = matcher.fork()
            for i, d in enumerate(drafts):
                assert walk.allows(d.token), (prefix, [x.token for x in drafts])
                assert d.forced == (walk.forced_tokens(1) == [d.token])
                walk.advance(d.token)
                assert d.token != EOS or i == len(drafts) - 1
            assert len(drafts) == 3 or drafts[-1].token == EOS
        rows = exact._log_probs(context, 3, vocab)
        best, path = _best_path(rows, matcher, EOS)
        got = exact.propose(context, matcher.fork(), 3, GREEDY, None, vocab)
        score = sum(float(rows[i, d.token]) for i, d in enumerate(got))
        score += sum(float(rows[i, EOS]) for i in range(len(got), 3))
        assert score == pytest.approx(best, abs=1e-5), (prefix, path, [d.token for d in got])
        checked += 1
    assert checked >= 10
    if kind == "regular":
        assert exact.dingo_drafts > 0 and exact.searched_drafts == 0
    else:
        assert exact.searched_drafts > 0 and exact.dingo_drafts == 0


def test_stop_below_ends_the_draft_before_an_unsure_position(vocab, regular):
    lm = diffusion(7)
    full = DiffusionDraft(lm, block=3, grammar=regular)
    cut = DiffusionDraft(lm, block=3, grammar=regular, stop_below=0.3)
    lengths = Counter()
    for prefix in _prefixes(regular, vocab, depth=3):
        matcher = regular.matcher()
        for t in prefix:
            matcher.advance(t)
        context = PROMPT + list(prefix)
        whole = [d.token for d in full.propose(context, matcher.fork(), 3, GREEDY, None, vocab)]
        kept = [d.token for d in cut.propose(context, matcher.fork(), 3, GREEDY, None, vocab)]
        probs = full._log_probs(context, 3, vocab).exp()
        n = next((i for i, t in enumerate(whole) if probs[i, t] < 0.3), len(whole))
        assert kept == whole[:n]
        lengths[len(kept) == len(whole)] += 1
    assert lengths[True] and lengths[False]  # some drafts cut, some whole
    lm_target, _ = target(vocab, 4)
    expected = generate(PROMPT, model=lm_target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=16)
    out = speculative_decode(lm_target, cut, vocab, PROMPT, regular.matcher(), k=3, max_tokens=16, params=GREEDY)
    assert out.token_ids == expected.token_ids
    with pytest.raises(ValueError, match="stop_below"):
        DiffusionDraft(lm, stop_below=1.0)


def test_the_mask_and_columns_past_the_vocabulary_are_never_drafted(vocab, regular):
    lm = diffusion(1, mask_bias=100.0)  # the mask column dominates every row
    draft = DiffusionDraft(lm, block=4, grammar=regular)
    drafts = draft.propose(PROMPT, regular.matcher(), 4, GREEDY, None, vocab)
    assert drafts and all(d.token < vocab.logits_width for d in drafts)
    rows = draft._log_probs(PROMPT, 4, vocab)
    assert rows.shape == (4, vocab.logits_width) and torch.isfinite(rows).all()


def test_the_canvas_fits_the_model_and_has_block_masks(vocab, regular):
    lm = diffusion(1)
    draft = DiffusionDraft(lm, block=5, max_positions=9)
    draft.propose(PROMPT + [A], regular.matcher(), 2, GREEDY, None, vocab)
    assert lm.canvases[-1] == tuple(PROMPT[-3:] + [A] + [MASK] * 5)  # cut from the left, 9 positions
    wide = DiffusionDraft(lm, block=2)
    wide.propose(PROMPT, regular.matcher(), 4, GREEDY, None, vocab)
    assert lm.canvases[-1] == tuple(PROMPT + [MASK] * 4)  # at least k masks


def test_arguments_are_checked():
    lm = diffusion(1)
    for bad in ({"block": 0}, {"beam": True}, {"max_positions": 1}):
        with pytest.raises(ValueError):
            DiffusionDraft(lm, **bad)
    with pytest.raises(TypeError, match="MaskedDiffusionLM"):
        DiffusionDraft(object())
    with pytest.raises(TypeError, match="CompiledGrammar"):
        DiffusionDraft(lm, grammar=REGEX)
    assert DiffusionDraft(lm).propose(PROMPT, None, 0, GREEDY, None, None) == []


# --- sampled: the exact masked distribution of the target ---------------------------------------

N = 1500


def _exact_with_budget(fn, matcher, width, params, max_tokens):
    """The law of masked sampling with a token budget: sentences (ending with EOS) and the texts cut
    at ``max_tokens`` tokens (what the decoders emit with finish_reason "length")."""
    out: dict[tuple[int, ...], float] = {}
    stack = [((), matcher.fork(), 1.0)]
    while stack:
        prefix, m, p = stack.pop()
        probs = masked_distribution(fn(list(prefix)).reshape(-1), m, params)
        for t in torch.nonzero(probs).flatten().tolist():
            q = p * float(probs[t])
            if t == EOS:
                out[prefix + (EOS,)] = out.get(prefix + (EOS,), 0.0) + q
            elif len(prefix) + 1 == max_tokens:
                out[prefix + (t,)] = q
            else:
                child = m.fork()
                child.advance(t)
                stack.append((prefix + (t,), child, q))
    return out


def _sample(vocab, grammar, draft, params, max_tokens, seed, exact):
    lm, _ = target(vocab, 1)
    generator = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    drafted = accepted = 0
    for _ in range(N):
        out = speculative_decode(lm, draft, vocab, PROMPT, grammar.matcher(), k=3, max_tokens=max_tokens,
                                 params=params, generator=generator)
        counts[tuple(out.token_ids) + ((EOS,) if out.finish_reason == "stop" else ())] += 1
        drafted += out.drafted - out.forced_tokens
        accepted += out.accepted - out.forced_tokens
    assert 0 < accepted < drafted  # rejections happen
    return chisquare_pvalue(counts, exact)


@pytest.mark.statistical
@pytest.mark.slow
def test_sampled_regular_with_dingo_drafts_is_the_target_distribution(vocab, regular):
    params = SamplingParams(temperature=0.9)
    exact = exact_masked(target(vocab, 1)[1], regular.matcher(), vocab.logits_width, params=params)
    draft = DiffusionDraft(diffusion(2), block=4, grammar=regular)
    assert _sample(vocab, regular, draft, params, 16, 1, exact) > 0.01
    assert draft.dingo_drafts > 0 and draft.searched_drafts == 0


@pytest.mark.statistical
@pytest.mark.slow
def test_sampled_context_free_with_searched_drafts_is_the_target_distribution(vocab, dyck):
    params = SamplingParams(top_k=4)
    exact = _exact_with_budget(target(vocab, 1)[1], dyck.matcher(), vocab.logits_width, params, 7)
    draft = DiffusionDraft(diffusion(3), block=4)
    assert _sample(vocab, dyck, draft, params, 7, 1, exact) > 0.01
    assert draft.searched_drafts > 0


# --- a real model: random-weights ModernBERT over the GPT-2 vocabulary --------------------------


def test_random_modernbert_drafts_for_a_gpt2_target(tiny_gpt2, gpt2_vocab):
    from engine import HFCausalLM, HFMaskedDiffusionLM
    from engine.diffusion_draft import _position_logits
    from engine.tiny_diffusion import DiffusionConfig, build_diffusion_model

    model = build_diffusion_model(DiffusionConfig(vocab_size=50258, mask_token_id=50257, n_layer=1, hidden=16,
                                                  n_head=2, eos_token_id=50256), seed=3)
    lm = HFMaskedDiffusionLM(model)
    assert lm.logits_width == gpt2_vocab.logits_width + 1
    canvas = gpt2_vocab.encode("Schema: x\nJSON: ") + [50257] * 6
    full = lm.canvas_logits([canvas])[0]
    assert torch.allclose(_position_logits(lm, canvas, len(canvas) - 6, len(canvas) - 2), full[-6:-2], atol=1e-5)

    regex = r"\[(true|false|null|[0-9]{1,3})(, [a-z]{1,5}){2,4}\]"
    options = {"model": HFCausalLM(tiny_gpt2), "tokenizer": gpt2_vocab, "temperature": 0, "max_tokens": 30}
    prompt = "A list: [true, null, 7, abc]. Another: "
    plain = generate(prompt, regex=regex, **options)
    grammar = Compiler(gpt2_vocab).compile_regex(regex)
    for draft in (DiffusionDraft(lm, block=8, grammar=grammar), DiffusionDraft(lm, block=8)):
        fast = generate(prompt, regex=regex, draft_model=draft, num_speculative_tokens=4, **options)
        assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason
        if draft.grammar is not None:  # bound to this constraint already: generate drafts with it, DINGO
            assert draft.calls > 0 and draft.dingo_drafts > 0
        else:  # generate drafts with a copy bound to its constraint; the caller's object is untouched
            assert draft.calls == 0


def test_resolve_draft_recognises_masked_diffusion_models():
    """``generate``'s ``draft_model=`` takes a masked-diffusion model in any of its forms."""
    from engine.diffusion_lm import HFMaskedDiffusionLM
    from engine.speculative import DraftModel, resolve_draft
    from engine.tiny_diffusion import DiffusionConfig, build_diffusion_model

    scripted = diffusion(0)
    source = resolve_draft(scripted)
    assert isinstance(source, DiffusionDraft) and source.model is scripted
    model = build_diffusion_model(DiffusionConfig(vocab_size=12, mask_token_id=11, n_layer=1, hidden=16, n_head=2,
                                                  eos_token_id=10), seed=0)
    wrapped = resolve_draft(model)  # a transformers masked LM: a diffusion drafter, not a causal draft model
    assert isinstance(wrapped, DiffusionDraft) and isinstance(wrapped.model, HFMaskedDiffusionLM)
    assert not isinstance(wrapped, DraftModel)
    with pytest.raises(TypeError, match="masked-diffusion"):
        resolve_draft(3.5)


def test_resolve_draft_loads_a_masked_diffusion_checkpoint(tmp_path):
    """A saved masked LM, named as ``"diffusion:PATH"`` or as a plain path (its config says what it
    is), loads as a diffusion drafter; a causal checkpoint stays a causal draft model."""
    from engine.speculative import DraftModel, resolve_draft
    from engine.tiny_diffusion import DiffusionConfig, build_diffusion_model

    build_diffusion_model(DiffusionConfig(vocab_size=12, mask_token_id=11, n_layer=1, hidden=16, n_head=2,
                                          eos_token_id=10), seed=0).save_pretrained(tmp_path / "masked")
    for spec in (f"diffusion:{tmp_path / 'masked'}", str(tmp_path / "masked")):
        source = resolve_draft(spec)
        assert isinstance(source, DiffusionDraft) and source.model.mask_token_id == 11
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=12, n_embd=16, n_layer=1, n_head=2)).save_pretrained(tmp_path / "causal")
    assert isinstance(resolve_draft(str(tmp_path / "causal")), DraftModel)
