"""Every sampler keeps budget-aware closing's promise: when the shortest completion fits
``max_tokens`` from the start, the row ends on EOS with a complete value, whatever the model wants.

Before, ASAp raised ``RuntimeError: ASAp must draw every token…`` in about a third of tight-budget
runs (the loop overrode its draws behind its back), and SMC ignored closing altogether: with 12
tokens where closing needs 6 it returned ``"length"`` and a truncated object, and with
``temperature=0`` no token at all. Scripted models over the byte vocabulary, milliseconds each.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine import ScriptedLM, generate
from engine.generate import _sampler_key
from grammars import Compiler
from samplers import ASAp

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
SAMPLERS = ["masked", "asap", "awrs", "smc"]


@pytest.fixture(scope="module")
def compiler(byte_vocab):
    pytest.importorskip("grammars.frontends.json_schema")
    return Compiler(byte_vocab)


@pytest.fixture(scope="module")
def closing_cost(byte_vocab, compiler) -> int:
    """Tokens the shortest completion takes from the start, EOS included (16 here)."""
    return len(compiler.compile_json_schema(SCHEMA).matcher().shortest_completion()) + 1


def random_lm(vocab, scale: float = 3.0) -> ScriptedLM:
    """Pseudo-random logits per prefix: different seeds take different paths."""

    def script(prefix):
        gen = torch.Generator().manual_seed(hash(prefix) % (2**31))
        return torch.randn(vocab.logits_width, generator=gen) * scale

    return ScriptedLM(vocab.logits_width, script)


def never_closes(vocab) -> ScriptedLM:
    """Wants string content forever: quotes, braces and EOS are all but ruled out."""
    row = {vocab.token_bytes.index(p): v for p, v in ((b"a", 8.0), (b"b", 7.0), (b"1", 6.0), (b'"', -20.0),
                                                      (b"}", -30.0), (b'"}', -30.0))}
    row[min(vocab.eos_token_ids)] = -30.0
    return ScriptedLM(vocab.logits_width, lambda prefix: row)


MODELS = {"random": random_lm, "never_closes": never_closes}


def valid(value) -> bool:
    return (isinstance(value, dict) and set(value) >= {"name", "age"} and isinstance(value["name"], str)
            and isinstance(value["age"], int))


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("slack", [0, 1, 4])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_tight_budgets_end_with_a_complete_value(byte_vocab, compiler, closing_cost, sampler, temperature, slack,
                                                 model):
    lm = MODELS[model](byte_vocab)
    max_tokens = closing_cost + slack
    for seed in (0, 1):
        result = generate("P", model=lm, tokenizer=byte_vocab, compiler=compiler, schema=SCHEMA, sampler=sampler,
                          temperature=temperature, max_tokens=max_tokens, seed=seed)
        assert result.finish_reason == "stop", (result.text, result.finish_reason)
        assert len(result.token_ids) + 1 <= max_tokens  # EOS counts
        assert valid(json.loads(result.text)) and valid(result.value), result.text


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_an_impossible_budget_runs_to_length_without_error(byte_vocab, compiler, closing_cost, sampler):
    result = generate("P", model=random_lm(byte_vocab), tokenizer=byte_vocab, compiler=compiler, schema=SCHEMA,
                      sampler=sampler, max_tokens=closing_cost - 1, seed=0)
    assert result.finish_reason == "length" and len(result.token_ids) <= closing_cost - 1


def test_one_asap_sampler_learns_across_tight_calls(byte_vocab, compiler, closing_cost):
    """The reported failure: one ASAp instance, many seeds, a tight budget. Its trie stays the
    record of what it drew (steered draws included) and its key carries the budget."""
    sampler = ASAp()
    lm = random_lm(byte_vocab)
    budget = closing_cost + 2
    for seed in range(40):
        result = generate("P", model=lm, tokenizer=byte_vocab, compiler=compiler, schema=SCHEMA, sampler=sampler,
                          max_tokens=budget, seed=seed)
        assert result.finish_reason == "stop" and valid(result.value)
        trie = sampler.trie(sampler.keys()[0])
        assert trie.lookup(result.token_ids + [min(byte_vocab.eos_token_ids)]) is not None  # every token drawn by ASAp
    compiled = compiler.compile_json_schema(SCHEMA)
    assert sampler.keys() == [_sampler_key(result.prompt_token_ids, compiled, budget)]
    assert _sampler_key([1], compiled, budget) != _sampler_key([1], compiled, budget + 1) != _sampler_key([1], compiled)
    killed = [n for n in range(1, len(trie)) if trie.chat[n] == 0.0 and trie.mass[n] == 0.0]
    assert killed, "closing refused some draws, and ASAp recorded them as dead ends"
    assert 0.0 < trie.chat[0] < 1.0


def test_asap_refuses_fast_forward_up_front(byte_vocab, compiler):
    with pytest.raises(ValueError, match="fast_forward"):
        generate("P", model=random_lm(byte_vocab), tokenizer=byte_vocab, compiler=compiler, regex="xyz[0-9]",
                 sampler="asap", fast_forward=True, seed=0)


def test_smc_at_temperature_zero_is_greedy_constrained_decoding(byte_vocab, compiler, closing_cost):
    lm = random_lm(byte_vocab)
    masked = generate("P", model=lm, tokenizer=byte_vocab, compiler=compiler, schema=SCHEMA, sampler="masked",
                      temperature=0, max_tokens=closing_cost + 3, fast_forward=False)
    smc = generate("P", model=lm, tokenizer=byte_vocab, compiler=compiler, schema=SCHEMA, sampler="smc",
                   temperature=0, max_tokens=closing_cost + 3)
    assert smc.token_ids and smc.finish_reason == "stop" and valid(smc.value)
    assert smc.token_ids == masked.token_ids  # the same argmax over the same narrowed masks
    assert math.isnan(smc.log_weight)  # no estimate of a point mass


def test_steering_is_counted(byte_vocab, compiler, closing_cost):
    result = generate("P", model=never_closes(byte_vocab), tokenizer=byte_vocab, compiler=compiler, schema=SCHEMA,
                      sampler="awrs", max_tokens=closing_cost + 4, seed=0)
    assert result.finish_reason == "stop" and result.budget_steered >= 1


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_closing_gives_up_without_error_when_the_model_rules_out_every_closing_token(byte_vocab, compiler,
                                                                                     sampler):
    """``ab*c`` with 3 tokens: after ``a`` only ``c`` still closes, and the model gives it ``-inf``."""
    row = torch.zeros(byte_vocab.logits_width)
    row[ord("c")] = float("-inf")
    lm = ScriptedLM(byte_vocab.logits_width, lambda prefix: row)
    result = generate("P", model=lm, tokenizer=byte_vocab, compiler=compiler, regex="ab*c", sampler=sampler,
                      max_tokens=3, seed=0)
    assert result.finish_reason == "length" and "c" not in result.text
