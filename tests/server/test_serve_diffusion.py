"""``corral serve`` with a masked-diffusion model, over a real socket: the server tells the model
kind from its config, ``/infill`` fills every hole in one canvas (DINGO for regular constraints,
completability checks for context-free ones), and chat/completions decode one canvas per choice.

The model is a random tiny ModernBERT (``serve_helpers.build_tiny_diffusion_model``): what it
writes is noise, so every assertion is about the constraint holding and the protocol, never
about content.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from serve_helpers import API_KEY, MODEL_NAME, build_tiny_diffusion_model, start_server
from shared_data import vocab_file

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def diffusion_server(tmp_path_factory):
    folder = build_tiny_diffusion_model(tmp_path_factory.mktemp("tiny-diffusion-serve"), vocab_file("gpt-2"))
    log_path = tmp_path_factory.mktemp("serve-diffusion-log") / "server.log"
    proc = start_server(folder, log_path, "--compile-timeout", "20")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def dhttp(diffusion_server):
    import httpx

    with httpx.Client(base_url=diffusion_server.base_url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=180) as c:
        yield c


@pytest.fixture(scope="module")
def dclient(diffusion_server):
    from openai import OpenAI

    return OpenAI(base_url=diffusion_server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=180)


def test_health_names_the_model_kind(dhttp, http):
    assert dhttp.get("/health").json()["model_kind"] == "diffusion"
    assert http.get("/health").json()["model_kind"] == "causal"


def test_infill_segments_under_a_schema_in_one_canvas(dhttp):
    body = {"segments": ['{"name":"', '","age":', "}"], "json_schema": SCHEMA, "max_tokens_per_hole": 4,
            "steps": 4, "seed": 3}
    response = dhttp.post("/infill", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert len(out["fills"]) == 2 and all(out["fills"])
    assert out["text"] == '{"name":"' + out["fills"][0] + '","age":' + out["fills"][1] + "}"
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    assert 0 < out["tokens_predicted"] <= 8  # at most the masked positions of the two holes


def test_infill_llama_fields_with_gbnf(dhttp):
    response = dhttp.post("/infill", json={"input_prefix": "x = ", "input_suffix": ";", "grammar":
                                           'root ::= "x = " [0-9]+ ";"', "max_tokens_per_hole": 3, "seed": 1})
    assert response.status_code == 200, response.text
    out = response.json()
    assert re.fullmatch(r"x = [0-9]+;", out["text"]) and out["content"] == out["fills"][0]


def test_infill_with_the_builtin_json_grammar_checks_completability(dhttp):
    """A context-free constraint: the canvas is decoded with completability checks, not DINGO."""
    response = dhttp.post("/infill", json={"segments": ['{"k": [', "]}"], "grammar": "json",
                                           "max_tokens_per_hole": 2, "steps": 2, "seed": 0})
    assert response.status_code == 200, response.text
    out = response.json()
    assert isinstance(json.loads(out["text"])["k"], list)
    assert out["text"] == '{"k": [' + out["fills"][0] + "]}"


def test_infill_uncompletable_is_400(dhttp):
    response = dhttp.post("/infill", json={"segments": ['{"name":', "}}}"], "json_schema": SCHEMA})
    assert response.status_code == 400 and response.json()["error"]["code"] == "uncompletable"


def test_chat_structured_output_from_a_canvas(dclient):
    out = dclient.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Someone, as JSON."}], max_tokens=24, seed=5, n=2,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    assert len(out.choices) == 2
    for choice in out.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert choice.finish_reason == "stop"
    # (not bounded by max_tokens: a witness that closes the canvas's last holes may take more tokens
    # than the positions it fills; see the roadmap's token-exact hole bounds)
    assert out.usage.completion_tokens > 0


def test_streaming_delivers_the_same_canvas(dclient):
    kwargs = dict(model=MODEL_NAME, prompt="Regex:", max_tokens=8, seed=11, temperature=1.0,
                  extra_body={"structured_outputs": {"regex": "[a-z]{2,6}"}})
    plain = dclient.completions.create(**kwargs).choices[0].text
    assert re.fullmatch(r"[a-z]{2,6}", plain)
    chunks = list(dclient.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain


def test_unconstrained_completion_reports_length_or_stop(dclient):
    out = dclient.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=6, seed=2)
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert 0 < out.usage.completion_tokens <= 6


def test_token_samplers_other_than_masked_are_refused(dhttp):
    response = dhttp.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "a", "max_tokens": 4,
                                                   "sampler": "asap", "structured_outputs": {"regex": "[a-z]+"}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "sampler" and "masked-diffusion" in error["message"]
    assert dhttp.get("/health").status_code == 200  # and the server keeps answering


def test_steps_on_an_autoregressive_model_is_400(http):
    """The session's causal server refuses the diffusion-only field by name."""
    response = http.post("/infill", json={"segments": ["a", "b"], "grammar": 'root ::= "a" [a-z]* "b"', "steps": 3})
    assert response.status_code == 400 and response.json()["error"]["param"] == "steps"
