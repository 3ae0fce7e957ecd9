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


def _assert_in_its_positions(result, canvas_length: int) -> None:
    """Token-exact: the text is the canvas's tokens, one per position, none beyond the canvas."""
    assert result.overflow == 0
    assert len(result.position_bytes) == canvas_length and b"".join(result.position_bytes) == result.text
    assert len(result.token_ids) <= canvas_length


def test_witness_fills_take_exactly_the_positions_they_close(vocab):
    """Random models under a JSON Schema and a record grammar, canvases from cramped to roomy, one
    block and semi-autoregressive: every output is valid and occupies the canvas's positions."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "minLength": 3}, "n": {"type": "integer"}},
              "required": ["name", "n"], "additionalProperties": False}
    compiler = Compiler(vocab)
    grammars = [(compiler.compile_json_schema(schema), lambda text: jsonschema.validate(json.loads(text), schema)),
                (compiler.compile_gbnf(RECORDS), None)]
    for (grammar, validate), length, block, seed in [(g, n, b, s) for g in grammars for n in (18, 40)
                                                     for b in (None, 8) for s in range(1)]:
        result = diffusion_decode(random_lm(vocab.logits_width, seed), vocab, [EOS], grammar, canvas_length=length,
                                  steps=length // 3, block_length=block, mode="infill", temperature=1.0,
                                  generator=torch.Generator().manual_seed(seed))
        assert grammar.completable([result.text]), result.text
        if validate:
            validate(result.text)
        _assert_in_its_positions(result, length)


def test_a_fill_that_cannot_fit_its_positions_reopens_the_model_commit_next_to_it(vocab):
    """"a" and "e" are committed with one position between; the language needs "bcd" there (or
    nothing), and no token spells "bcd": the witness masks the "e" again and writes "e" itself."""
    grammar = Compiler(vocab).compile_gbnf('root ::= "a" ("bcd")* "e"')
    lm = _peaked_lm(vocab, {0: {ord("a"): 9.0}, 2: {ord("e"): 8.0}, 1: {ord("x"): 1.0}})
    result = diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=3, steps=3, mode="infill",
                              unmasking="confidence", max_resamples=2)
    assert result.text == b"ae" and result.reopened == 1
    assert result.token_ids == [ord("a"), ord("e")]
    _assert_in_its_positions(result, 3)


def test_given_positions_are_never_reopened_and_a_misfit_is_reported_as_overflow(vocab):
    grammar = Compiler(vocab).compile_gbnf('root ::= "a" ("bcd")* "e"')
    canvas = [ord("a"), MASK, ord("e")]
    result = diffusion_decode(random_lm(vocab.logits_width, 0), vocab, [EOS], grammar, canvas=canvas, steps=2,
                              mode="infill")
    assert result.text == b"abcde" and result.reopened == 0
    assert result.overflow == 1 and len(result.token_ids) == 4  # "ab" "c" "d" "e" in three positions
    assert result.witness_bytes == 3


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
    assert result.value is not None and isinstance(result.value["ok"], bool) and result.finish_reason == "stop"
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


def test_a_check_past_its_limits_refuses_the_proposal_and_decoding_goes_on(vocab, monkeypatch):
    """Every third completability check runs out of its ``Limits``: the proposal is refused."""
    from grammars import LimitExceeded
    from grammars.automata.holes import PrefixChart

    real, calls = PrefixChart.completable, []

    def every_third_undecided(chart, parts, hole_bytes=None):
        calls.append(1)
        if len(calls) % 3 == 0:
            raise LimitExceeded("max_infill_items", 1)
        return real(chart, parts, hole_bytes)

    monkeypatch.setattr(PrefixChart, "completable", every_third_undecided)
    grammar = Compiler(vocab).compile_gbnf(RECORDS)
    result = diffusion_decode(random_lm(vocab.logits_width, 7), vocab, [EOS], grammar, canvas_length=16, steps=8,
                              mode="infill", temperature=1.0, generator=torch.Generator().manual_seed(7))
    assert result.undecided == len(calls) // 3 > 0
    assert grammar.completable([result.text]), result.text  # never accepted unverified


def _peaked_lm(vocab, rows: dict[int, dict[int, float]]) -> ScriptedDiffusionLM:
    """A model that scores token t at canvas position i with ``rows[i][t]`` (else -10)."""

    def script(canvas):
        out = torch.full((len(canvas), vocab.logits_width), -10.0)
        start = len(canvas) - max(rows) - 1
        for i, scores in rows.items():
            for token, score in scores.items():
                out[start + i, token] = score
        return out

    return ScriptedDiffusionLM(vocab.logits_width, MASK, script)


def test_a_refused_step_commits_another_position_of_the_block(vocab):
    """Position 0 is the most confident but its only draw "x" is refused; position 1's "b" can be
    committed: the step commits it instead of nothing, and the next step, with nothing left that
    can be committed, ends the block for the witness rather than spending more model calls."""
    grammar = Compiler(vocab).compile_gbnf('root ::= "ab"')
    lm = _peaked_lm(vocab, {0: {ord("x"): 9.0}, 1: {ord("b"): 5.0}})
    result = diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=2, steps=2, mode="infill",
                              unmasking="confidence", max_resamples=1)
    assert result.text == b"ab"
    assert result.committed_per_step == [1, 0] and result.model_calls == 2
    assert result.witness_positions == 1 and result.witness_bytes == 1
    assert result.tokens_per_step == 0.5 and result.positions_per_call == 1.0


def test_a_block_nothing_can_be_committed_in_is_closed_after_one_call(vocab):
    grammar = Compiler(vocab).compile_gbnf('root ::= "ab" | "cd"')
    lm = _peaked_lm(vocab, {0: {ord("x"): 9.0}, 1: {ord("y"): 9.0}, 2: {ord("z"): 9.0}})
    result = diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=3, steps=3, mode="infill",
                              unmasking="confidence", max_resamples=2)
    assert result.model_calls == 1 and result.committed_per_step == [0]
    assert result.text in (b"ab", b"cd") and result.witness_bytes == 2
    assert result.witness_positions == 3  # the witness decided the whole run, its empty tail included


def test_a_canvas_the_witness_cannot_close_is_reported_incomplete(vocab, monkeypatch):
    """Nothing the model proposes can be committed and the witness hits a parser limit: the text
    is cut short, and says so (``complete`` False, ``finish_reason="length"``), never "stop"."""
    from engine import generate
    from grammars import CompiledGrammar
    from grammars.errors import LimitExceeded

    def over_the_limit(self, parts, *, hole_bytes=None):
        raise LimitExceeded("max_infill_items", 1, "a limit hit while closing the canvas")

    balanced = 'root ::= "a" root "b" | "ab"'  # context-free: closed by the witness, not DINGO
    grammar = Compiler(vocab).compile_gbnf(balanced)
    lm = _peaked_lm(vocab, {0: {ord("x"): 9.0}, 1: {ord("y"): 9.0}, 2: {ord("z"): 9.0}})
    closed = diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=3, steps=3, mode="infill",
                              unmasking="confidence", max_resamples=2)
    assert closed.complete is True and closed.text == b"ab"
    monkeypatch.setattr(CompiledGrammar, "complete", over_the_limit)
    cut = diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=3, steps=3, mode="infill",
                           unmasking="confidence", max_resamples=2)
    assert cut.complete is False and cut.text == b""
    result = generate("x", model=lm, tokenizer=vocab, grammar=balanced, canvas_length=3, steps=3,
                      unmasking="confidence", temperature=0)
    assert result.finish_reason == "length" and result.text == ""
    assert diffusion_decode(lm, vocab, [EOS], grammar, canvas_length=3, steps=3, mode="greedy").complete is None


def test_padding_after_an_eos_is_counted_apart_from_commits(vocab):
    lm = _peaked_lm(vocab, {0: {ord("x"): 10.0}, **{i: {EOS: 5.0} for i in range(1, 6)}})
    result = diffusion_decode(lm, vocab, [EOS], None, canvas_length=6, steps=6, unmasking="confidence")
    assert result.text == b"x" and result.committed_per_step == [1, 1]
    assert result.padded == 4 and result.tokens_per_step == 1.0 and result.positions_per_call == 3.0


def test_the_output_prefix_is_read_by_every_constrained_mode(vocab):
    """The canvas continues "ab" of ``"ab" [0-9]+ "c"``: exact modes write a valid rest, greedy's
    first position (its left context decided by the prefix) is a digit."""
    prefix = [ord("a"), ord("b")]
    for grammar in (Compiler(vocab).compile_regex("ab[0-9]{1,4}c"), Compiler(vocab).compile_gbnf('root ::= "ab" [0-9]+ "c"')):
        for seed in range(3):
            for mode in ("auto", "infill", "greedy"):
                if mode == "auto" and not grammar.is_regular:
                    continue
                result = diffusion_decode(random_lm(vocab.logits_width, seed), vocab, [EOS] + prefix, grammar,
                                          canvas_length=6, steps=3, mode=mode, output_prefix=prefix,
                                          temperature=1.0, generator=torch.Generator().manual_seed(seed))
                if mode == "greedy":
                    assert result.text[:1].isdigit(), result.text
                else:
                    assert grammar.completable([b"ab" + result.text]), (mode, result.text)
                    assert result.text[:1].isdigit()  # the text is the canvas' alone
    with pytest.raises(ValueError, match="output_prefix"):
        diffusion_decode(random_lm(vocab.logits_width), vocab, [EOS], grammar, canvas_length=4, output_prefix=[ord("z")])


def test_outputs_under_joint_refusals_are_exactly_the_language(vocab):
    """Two positions under ``ac|cb`` proposed together by a random model at temperature 1 (most
    pairs refused jointly, then kept in part or widened), over many seeds: the outputs seen are
    exactly the language's two sentences, enumerated."""
    grammar = Compiler(vocab).compile_gbnf('root ::= "ac" | "cb"')
    seen = set()
    for seed in range(40):
        result = diffusion_decode(random_lm(vocab.logits_width, seed), vocab, [EOS], grammar, canvas_length=2,
                                  steps=1, mode="infill", temperature=1.0, max_resamples=3,
                                  generator=torch.Generator().manual_seed(seed))
        seen.add(result.text)
    assert seen == {b"ac", b"cb"}
