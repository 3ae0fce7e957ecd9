"""The loop's fast paths: unconstrained rows without masks, ignore_eos, greedy draws, the
planner's byte-count shortcut and closing from the first step (mask application itself:
``tests/samplers/test_kernels.py``)."""

from __future__ import annotations

import json

import pytest

from engine import ClosingPlanner, ScriptedLM, generate
from grammars import Compiler


@pytest.fixture(scope="module")
def compiler(byte_vocab):
    return Compiler(byte_vocab)


def eos_lover(vocab):
    eos = min(vocab.eos_token_ids)
    return ScriptedLM(vocab.logits_width, lambda prefix: {eos: 10.0, vocab.token_bytes.index(b"a"): 1.0})


def test_unconstrained_rows_skip_masks_and_ignore_eos(byte_vocab, compiler):
    lm = eos_lover(byte_vocab)
    stopped = generate("P", model=lm, tokenizer=byte_vocab, compiler=compiler, max_tokens=7, temperature=0)
    assert stopped.finish_reason == "stop" and stopped.token_ids == []
    forced = generate("P", model=lm, tokenizer=byte_vocab, compiler=compiler, max_tokens=7, temperature=0,
                      ignore_eos=True)
    assert forced.finish_reason == "length" and forced.text == "a" * 7
    assert len(forced.per_token_s) == 7


def test_ignore_eos_leaves_constrained_rows_alone(byte_vocab, compiler):
    lm = eos_lover(byte_vocab)
    result = generate("P", regex="a+", model=lm, tokenizer=byte_vocab, compiler=compiler, max_tokens=9,
                      temperature=0, ignore_eos=True)
    assert result.text == "a" and result.finish_reason == "stop"  # the grammar decides the end


def test_planner_fits_agrees_with_tokens_to_close(byte_vocab, compiler, json_gbnf):
    planner = ClosingPlanner(byte_vocab)
    grammar = compiler.compile_gbnf(json_gbnf)
    for prefix in ['{"a":[[{"b":[1,', '{"k": {"x": "abc', '{', '{"a":tr']:
        m = grammar.matcher()
        for b in prefix.encode():
            m.advance(b)
        need = planner.tokens_to_close(m)
        for budget in range(max(0, need - 2), need + 3):
            assert planner.fits(m, budget) == (need <= budget), (prefix, budget)


def test_closing_from_the_first_step_even_with_deep_nesting(byte_vocab, compiler, json_gbnf):
    """A model that only ever opens arrays: with no horizon the loop steers from the first step,
    so the value closes exactly at the budget."""
    opener = byte_vocab.token_bytes.index(b"[")
    lm = ScriptedLM(byte_vocab.logits_width, lambda prefix: {opener: 5.0})
    grammar = compiler.compile_gbnf('root ::= "{\\"a\\":" v "}"\nv ::= "[" v "]" | "0"')
    for budget in (8, 20, 41):
        result = generate("P", grammar=grammar, model=lm, tokenizer=byte_vocab, max_tokens=budget, temperature=0)
        assert result.finish_reason == "stop", budget
        json.loads(result.text)
        assert budget - 1 <= len(result.token_ids) + 1 <= budget  # as deep as the budget allows (7 + 2n tokens)
