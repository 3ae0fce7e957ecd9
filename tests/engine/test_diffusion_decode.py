"""The diffusion decoder: every constrained output valid, commits checked jointly, policies obeyed."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from engine.diffusion import (
    ConfidenceThreshold,
    EntropyBounded,
    FixedCount,
    canvas_parts,
    diffusion_decode,
)
from engine.diffusion_lm import ScriptedDiffusionLM
from grammars import Compiler, TokenVocabulary

PIECES = [bytes([b]) for b in range(256)] + [b'{"', b'":', b'",', b'"}', b"true", b"null", b"12", b"ab"]
EOS = len(PIECES)
MASK = EOS + 1


@pytest.fixture(scope="module")
def vocab():
    return TokenVocabulary.from_bytes(PIECES + [b"", b""], eos_token_ids=[EOS], special_token_ids=[EOS, MASK])


def random_lm(width: int, seed: int = 0) -> ScriptedDiffusionLM:
    generator = torch.Generator().manual_seed(seed)

    def script(canvas):
        return torch.randn(len(canvas), width, generator=generator) * 3

    return ScriptedDiffusionLM(width, MASK, script)


RECORDS = 'root ::= "{" kv ("," kv)* "}"\nkv ::= "\\"" [a-z]+ "\\":" v\nv ::= [0-9]+ | "[" (v ("," v)*)? "]"'


def test_context_free_outputs_are_always_valid(vocab):
    compiler = Compiler(vocab)
    grammar = compiler.compile_gbnf(RECORDS)
    for seed in range(4):
        result = diffusion_decode(random_lm(vocab.logits_width, seed), vocab, [EOS], grammar, canvas_length=24,
                                  steps=8, mode="infill", temperature=1.0,
                                  generator=torch.Generator().manual_seed(seed))
        assert grammar.completable([result.text]), result.text
        assert result.checks >= 1 and result.model_calls >= 1


def test_json_schema_outputs_validate(vocab):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}
    grammar = Compiler(vocab).compile_json_schema(schema)
    for seed in range(3):
        result = diffusion_decode(random_lm(vocab.logits_width, seed), vocab, [EOS], grammar, canvas_length=20,
                                  steps=10, mode="infill")
        jsonschema.validate(json.loads(result.text), schema)


def test_regular_constraints_with_dingo_fill_the_canvas_validly(vocab):
    grammar = Compiler(vocab).compile_regex(r"[a-c]{2,4}-[0-9]{1,3}")
    for seed, unmasking in enumerate([FixedCount(), ConfidenceThreshold(0.5), EntropyBounded(2.0)]):
        result = diffusion_decode(random_lm(vocab.logits_width, seed), vocab, [EOS], grammar, canvas_length=10,
                                  steps=4, unmasking=unmasking)
        assert grammar.completable([result.text]), result.text
        assert sum(result.committed_per_step) >= len(result.token_ids)


def test_joint_checking_catches_a_pair_valid_alone_but_invalid_together(vocab):
    """Two positions proposed in one step: "a" at 0 and "b" at 1 are each completable ("a..", ".b.")
    but "ab" is not in (ac|cb); the commit must not take both."""
    grammar = Compiler(vocab).compile_gbnf('root ::= "ac" | "cb"')
    preferred = {0: ord("a"), 1: ord("b")}

    def script(canvas):
        rows = torch.full((len(canvas), vocab.logits_width), -5.0)
        for i in range(len(canvas) - 2, len(canvas)):
            rows[i, preferred[i - (len(canvas) - 2)]] = 5.0
            rows[i, ord("c")] = 4.0
        return rows

    lm = ScriptedDiffusionLM(vocab.logits_width, MASK, script)
    result = diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=2, steps=1, mode="infill")
    assert result.text in (b"ac", b"cb")
    assert result.refused >= 1
    free = diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=2, steps=1, mode="none")
    assert free.text == b"ab"  # unconstrained, the pair is committed as proposed


def test_threshold_commits_many_positions_per_step(vocab):
    def script(canvas):
        rows = torch.full((len(canvas), vocab.logits_width), -10.0)
        rows[:, ord("x")] = 10.0
        return rows

    lm = ScriptedDiffusionLM(vocab.logits_width, MASK, script)
    result = diffusion_decode(lm, vocab, [EOS], None, canvas_length=8, steps=8, unmasking="threshold")
    assert result.model_calls == 1 and result.committed_per_step == [8]
    slow = diffusion_decode(lm, vocab, [EOS], None, canvas_length=8, steps=8, unmasking="confidence")
    assert slow.model_calls == 8


def test_canvas_parts_read_holes_with_position_bounds(vocab):
    a, b = ord("a"), ord("b")
    parts, holes = canvas_parts([a, MASK, MASK, b, MASK, EOS, EOS], MASK, frozenset({EOS}), vocab)
    assert parts == [b"a", b"b", b""] and holes == [(2, None), (0, None)]
    parts, holes = canvas_parts([MASK, a], MASK, frozenset({EOS}), vocab)
    assert parts == [b"", b"a"] and holes == [(1, None)]


def test_arguments_are_checked(vocab):
    lm = random_lm(vocab.logits_width)
    grammar = Compiler(vocab).compile_gbnf(RECORDS)
    with pytest.raises(ValueError):
        diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=0)
    with pytest.raises(ValueError):
        diffusion_decode(lm, vocab, [EOS], grammar, mode="dingo")  # not regular
    with pytest.raises(ValueError):
        diffusion_decode(lm, vocab, [EOS], None, mode="infill")
    with pytest.raises(ValueError):
        diffusion_decode(lm, vocab, [EOS], grammar, unmasking="sideways")
    with pytest.raises(ValueError):
        diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=8, block_length=9)
    assert np.all(FixedCount().choose(np.array([0.1, 0.9, 0.5]), np.zeros(3), 2) == np.array([1, 2]))


def test_generate_dispatches_on_a_diffusion_model(vocab):
    from engine import generate

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    result = generate("x", model=random_lm(vocab.logits_width), tokenizer=vocab, schema=schema, canvas_length=16,
                      steps=8, seed=0)
    assert result.value is not None and isinstance(result.value["ok"], bool)
    regex = generate("x", model=random_lm(vocab.logits_width, 1), tokenizer=vocab, regex="[0-9]{3}",
                     canvas_length=6, steps=3, unmasking="threshold")
    assert len(regex.text) == 3 and regex.text.isdigit()


def test_infill_with_a_diffusion_model_keeps_the_parts_and_stays_valid(vocab):
    from engine import infill

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["name", "n"], "additionalProperties": False}
    parts = ['{"name":"', '","n":', "}"]
    for seed in range(3):
        result = infill(parts, model=random_lm(vocab.logits_width, seed), tokenizer=vocab, schema=schema,
                        max_tokens_per_hole=4, seed=seed)
        value = json.loads(result.text)
        jsonschema.validate(value, schema)
        assert result.text == parts[0] + result.fills[0] + parts[1] + result.fills[1] + parts[2]
    grammar = 'root ::= "a" [xy]+ "b" [0-9]+ "c"'
    result = infill(["a", "b", "c"], model=random_lm(vocab.logits_width, 7), tokenizer=vocab, grammar=grammar,
                    max_tokens_per_hole=2)
    assert result.text.startswith("a") and result.text.endswith("c") and len(result.fills) == 2
    assert all(set(f) <= set("xy") for f in result.fills[:1]) and result.fills[1].isdigit()


@pytest.mark.slow
def test_a_random_model_under_the_cpp_grammar_writes_only_cpp(vocab):
    from grammars import builtin_grammar

    grammar = Compiler(vocab).compile_lark(builtin_grammar("cpp"))
    result = diffusion_decode(random_lm(vocab.logits_width, 3), vocab, [EOS], grammar, canvas_length=8, steps=4,
                              mode="infill")
    assert grammar.completable([result.text]), result.text


class _EveryThirdCheckUndecided:
    """A compiled grammar whose every third completability check runs out of its ``Limits``."""

    def __init__(self, grammar):
        self._grammar, self.calls = grammar, 0

    def __getattr__(self, name):
        return getattr(self._grammar, name)

    def completable(self, parts, **kwargs):
        from grammars import LimitExceeded

        self.calls += 1
        if self.calls % 3 == 0:
            raise LimitExceeded("max_infill_items", 1)
        return self._grammar.completable(parts, **kwargs)


def test_a_check_past_its_limits_refuses_the_proposal_and_decoding_goes_on(vocab):
    grammar = Compiler(vocab).compile_gbnf(RECORDS)
    flaky = _EveryThirdCheckUndecided(grammar)
    result = diffusion_decode(random_lm(vocab.logits_width, 7), vocab, [EOS], flaky, canvas_length=16, steps=8,
                              mode="infill", temperature=1.0, generator=torch.Generator().manual_seed(7))
    assert result.undecided == flaky.calls // 3 > 0
    assert grammar.completable([result.text]), result.text  # never accepted unverified
