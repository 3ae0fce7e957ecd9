"""``generate`` end to end with random tiny transformers models over the real GPT-2 vocabulary.

A random model wants nothing in particular, so whatever comes out valid is the constraint's
doing: outputs must fullmatch the regex, parse as JSON, validate against the schema.
"""

from __future__ import annotations

import json
import re

import pytest

from engine import HFCausalLM, generate, generate_batch

EMAIL = r"[a-z]{1,8}@[a-z]{2,6}\.(com|org)"


@pytest.fixture(scope="module")
def lm(tiny_gpt2):
    return HFCausalLM(tiny_gpt2)


def test_regex_outputs_match(lm, gpt2_vocab, gpt2_compiler):
    for seed in range(4):
        result = generate("Email: ", regex=EMAIL, model=lm, tokenizer=gpt2_vocab, compiler=gpt2_compiler,
                          seed=seed, max_tokens=24)
        assert re.fullmatch(EMAIL, result.text), result.text
        assert result.finish_reason == "stop"
        assert gpt2_vocab.decode(result.token_ids).decode() == result.text


def test_json_grammar_outputs_parse_within_a_small_budget(lm, gpt2_vocab, gpt2_compiler, json_gbnf):
    for seed, max_tokens in [(0, 12), (1, 20), (2, 32)]:
        result = generate("JSON: ", grammar=json_gbnf, model=lm, tokenizer=gpt2_vocab, compiler=gpt2_compiler,
                          seed=seed, max_tokens=max_tokens)
        assert result.finish_reason == "stop", result.text
        json.loads(result.text)
        assert len(result.token_ids) < max_tokens


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def test_schema_outputs_validate(lm, gpt2_vocab, gpt2_compiler):
    pytest.importorskip("grammars.frontends.json_schema")
    jsonschema = pytest.importorskip("jsonschema")
    for seed in range(3):
        result = generate("Person: ", schema=SCHEMA, model=lm, tokenizer=gpt2_vocab, compiler=gpt2_compiler,
                          seed=seed, max_tokens=40)
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(result.value, SCHEMA)
        assert result.value == json.loads(result.text)


def test_pydantic_schema_gives_an_instance(lm, gpt2_vocab, gpt2_compiler):
    pytest.importorskip("grammars.frontends.json_schema")
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int
        y: int

    result = generate("Point: ", schema=Point, model=lm, tokenizer=gpt2_vocab, compiler=gpt2_compiler,
                      seed=0, max_tokens=24)
    assert result.finish_reason == "stop", result.text
    assert isinstance(result.value, Point)


def test_batch_equals_sequential_on_a_real_model(tiny_gpt2, gpt2_vocab, gpt2_compiler):
    """Documented property: rows of a padded batch draw what single calls draw (float32, CPU)."""
    prompts = ["Email: ", "Write an email address please: ", "x"]
    batch = generate_batch(prompts, regex=EMAIL, model=HFCausalLM(tiny_gpt2), tokenizer=gpt2_vocab,
                           compiler=gpt2_compiler, seed=5, max_tokens=20)
    single = [generate(p, regex=EMAIL, model=HFCausalLM(tiny_gpt2), tokenizer=gpt2_vocab, compiler=gpt2_compiler,
                       seed=5 + i, max_tokens=20) for i, p in enumerate(prompts)]
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]


def test_model_and_tokenizer_from_a_path(tiny_model_dir):
    result = generate("Email: ", regex=EMAIL, model=str(tiny_model_dir), seed=0, max_tokens=24)
    assert re.fullmatch(EMAIL, result.text) and result.finish_reason == "stop"


def test_loaded_model_with_a_transformers_tokenizer(tiny_gpt2, gpt2_vocab):
    result = generate("Email: ", regex=EMAIL, model=tiny_gpt2, tokenizer=gpt2_vocab.hf_tokenizer, seed=1,
                      max_tokens=24, temperature=0.0)
    assert re.fullmatch(EMAIL, result.text)
    again = generate("Email: ", regex=EMAIL, model=tiny_gpt2, tokenizer=gpt2_vocab.hf_tokenizer, seed=2,
                     max_tokens=24, temperature=0.0)
    assert again.text == result.text  # greedy ignores the seed


def test_llama_architecture(tiny_llama, gpt2_vocab, gpt2_compiler):
    result = generate("n=", regex=r"[1-9][0-9]{0,3}", model=tiny_llama, tokenizer=gpt2_vocab,
                      compiler=gpt2_compiler, seed=0, max_tokens=8)
    assert re.fullmatch(r"[1-9][0-9]{0,3}", result.text)


def test_unconstrained_generation_and_stop_strings(lm, gpt2_vocab, gpt2_compiler):
    result = generate("Hello", model=lm, tokenizer=gpt2_vocab, compiler=gpt2_compiler, seed=0, max_tokens=6)
    assert result.finish_reason in ("length", "stop") and len(result.token_ids) <= 6
    cut = generate("Hello", model=lm, tokenizer=gpt2_vocab, compiler=gpt2_compiler, seed=0, max_tokens=30,
                   stop=[result.text[1:3]] if len(result.text) > 3 else ["e"])
    assert cut.finish_reason in ("stop_string", "stop", "length")
