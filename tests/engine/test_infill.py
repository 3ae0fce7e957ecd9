"""``engine.infill``: every output in the language, the draw exact, witnesses that close holes."""

from __future__ import annotations

import json
import math
from collections import Counter

import jsonschema
import pytest

from engine import HFCausalLM, ScriptedLM
from engine.infill import FIMTokens, UncompletableError, infill
from grammars import TokenVocabulary
from samplers.enumerate import chisquare_pvalue

PIECES = [bytes([b]) for b in range(256)] + [b'{"', b'":', b'",', b'"}', b"true", b"null", b"12", b"ab", b"xb"]
EOS = len(PIECES)
FIM = FIMTokens(EOS + 1, EOS + 2, EOS + 3)


@pytest.fixture(scope="module")
def vocab():
    specials = [EOS, EOS + 1, EOS + 2, EOS + 3]
    return TokenVocabulary.from_bytes(PIECES + [b""] * 4, eos_token_ids=[EOS], special_token_ids=specials)


RECORDS = 'root ::= "{" kv ("," kv)* "}"\nkv ::= "\\"" [a-z]+ "\\":" v\nv ::= [0-9]+ | "\\"" [a-zA-Z]* "\\""'


def in_language(vocab, grammar_text: str, text: str) -> bool:
    from grammars import compile_gbnf

    return compile_gbnf(grammar_text, vocab).completable([text])


def test_uniform_model_outputs_are_always_in_the_language(vocab):
    lm = ScriptedLM(vocab.logits_width, [{}])
    parts = ['{"name":"Al', ',"age":', "}"]
    ended_by_model = 0
    for seed in range(12):
        result = infill(parts, model=lm, tokenizer=vocab, grammar=RECORDS, seed=seed, max_tokens_per_hole=6)
        assert result.text == parts[0] + result.fills[0] + parts[1] + result.fills[1] + parts[2]
        assert in_language(vocab, RECORDS, result.text), result.text
        for hole in result.holes:
            assert hole.checks == len(hole.check_seconds) >= hole.tokens
            assert hole.fill.endswith(hole.witness)
            ended_by_model += not hole.closed_by_witness
    assert ended_by_model  # some holes closed by the model's own choice


def test_no_budget_means_the_shortest_witness(vocab):
    lm = ScriptedLM(vocab.logits_width, [{}])
    result = infill(['{"a":', "", ',"b":1}'], model=lm, tokenizer=vocab, grammar=RECORDS, max_tokens_per_hole=0)
    assert result.fills == ["0", ""]
    assert result.holes[0].end == "witness_budget" and result.holes[0].witness == "0"


def test_the_draw_is_the_model_renormalised_over_completable_tokens(vocab):
    """z is a live prefix ("azc" is in the language) but cannot reach the fixed "b": refused by
    the check, so fills follow the model's odds of x and y alone (and never z or q)."""
    grammar = 'root ::= "a" ([xy] "b" | "z" "c")'
    logits = {ord("x"): 1.0, ord("y"): 0.0, ord("z"): 3.0, ord("q"): 5.0, EOS: -50.0}
    lm = ScriptedLM(vocab.logits_width, lambda prefix: logits, default=-50.0)
    counts = Counter()
    n = 600
    for seed in range(n):
        result = infill(["a", "b"], model=lm, tokenizer=vocab, grammar=grammar, seed=seed, max_tokens_per_hole=2)
        counts[result.fills[0]] += 1
    assert set(counts) <= {"x", "y"}
    p_x = math.e / (math.e + 1)
    assert chisquare_pvalue(counts, {"x": p_x, "y": 1 - p_x}) > 0.001, counts


def test_fim_models_see_prefix_suffix_middle(vocab):
    lm = ScriptedLM(vocab.logits_width, [{EOS: 10.0}], default=-10.0)
    infill(["a", "b"], model=lm, tokenizer=vocab, grammar='root ::= "a" [xy]* "b"', fim=FIM)
    first = lm.prefixes[0]
    assert first == (FIM.prefix, ord("a"), FIM.suffix, ord("b"), FIM.middle)


def test_unconstrained_baseline_and_refusals(vocab):
    lm = ScriptedLM(vocab.logits_width, [{ord("q"): 10.0, EOS: 5.0}], default=-10.0)
    free = infill(["a", "b"], model=lm, tokenizer=vocab, constrained=False, seed=0, max_tokens_per_hole=3)
    assert free.fills == ["qqq"] and free.checks == 0
    result = infill(["a", "b"], model=lm, tokenizer=vocab, grammar='root ::= "a" [xy]* "b"', seed=0)
    assert result.fills == [""]  # q is never allowed; EOS ends the hole at once, and it can end there
    with pytest.raises(UncompletableError):
        infill(["a", "c"], model=lm, tokenizer=vocab, grammar='root ::= "a" [xy]* "b"')
    with pytest.raises(ValueError):
        infill(["a", "b"], model=lm, tokenizer=vocab, grammar='root ::= "a" "b"', sampler="asap")
    with pytest.raises(ValueError):
        infill(["a", "b"], model=lm, tokenizer=vocab, grammar='root ::= "a" "b"', max_tokens_per_hole=-1)


def test_json_schema_with_a_real_tokenizer_and_model(tiny_gpt2, gpt2_vocab):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "tags": {"type": "array", "items": {"type": "integer"}}},
              "required": ["name", "tags"], "additionalProperties": False}
    lm = HFCausalLM(tiny_gpt2)
    parts = ['{"name":"', '","tags":[', "]}"]
    for seed in range(3):
        result = infill(parts, model=lm, tokenizer=gpt2_vocab, schema=schema, seed=seed, max_tokens_per_hole=8)
        value = json.loads(result.text)
        jsonschema.validate(value, schema)
        assert result.text.startswith(parts[0]) and result.text.endswith(parts[2])


def test_cpp_holes_side_by_side_stay_in_the_language(vocab):
    """Two holes with no fixed text between them, under the C++ grammar, a model that draws any
    byte: the text after the first hole starts with a hole (a case the suffix oracle must
    handle), and every output is a C++ translation unit."""
    from grammars import Compiler, builtin_grammar

    grammar = Compiler(vocab).compile_lark(builtin_grammar("cpp"))
    lm = ScriptedLM(vocab.logits_width, [{}])
    parts = ["int f(int x) {\n  return x", "", ";\n}\n"]
    for seed in range(3):
        result = infill(parts, model=lm, tokenizer=vocab, grammar=grammar, seed=seed, max_tokens_per_hole=4)
        assert grammar.completable([result.text]), result.text
        assert len(result.setup_seconds) == 2 and all(s > 0 for s in result.setup_seconds)
        for hole in result.holes:
            assert hole.checks == len(hole.check_seconds) >= hole.tokens
