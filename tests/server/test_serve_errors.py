"""Bad input over real sockets: each case gets its 4xx with the OpenAI error object naming what is
wrong, never a 500, and the server keeps answering (``/health`` after every case)."""

from __future__ import annotations

import copy
import json

import pytest
from serve_helpers import API_KEY, MODEL_NAME

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BASE = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "x": {"type": "integer"}}}}}
BAD_TOOL = {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {
    "s": {"type": "string", "pattern": "(?=a)b"}}}}}
LOOKAHEAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)y"}}}
DROP = object()


def chat(**changes):
    body = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is DROP:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def completion(**changes):
    body = copy.deepcopy(COMPLETION)
    body.update(changes)
    return body


def schema_format(schema, **extra):
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, **extra}}


def nested(depth):
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


#: (id, method, path, body (dict: JSON; bytes: raw), status, code, param, text in the message)
CASES = [
    ("malformed-json", "POST", CHAT, b'{"model": "tiny",', 400, "invalid_json", None, "line 1"),
    ("empty-body", "POST", CHAT, b"", 400, "invalid_json", None, "empty"),
    ("json-array-body", "POST", CHAT, b"[1, 2]", 400, "invalid_json", None, "object"),
    ("not-utf8", "POST", CHAT, b'\xff\xfe{"a"', 400, "invalid_json", None, None),
    ("json-nested-too-deep", "POST", CHAT, b"[" * 200_000, 400, "invalid_json", None, None),
    ("missing-messages", "POST", CHAT, chat(messages=DROP), 400, "missing_required_parameter", "messages", None),
    ("missing-model", "POST", CHAT, chat(model=DROP), 400, "missing_required_parameter", "model", None),
    ("empty-messages", "POST", CHAT, chat(messages=[]), 400, None, "messages", None),
    ("unknown-field", "POST", CHAT, chat(respose_format={"type": "json_object"}), 400, "unknown_parameter",
     "respose_format", "respose_format"),
    ("bad-role", "POST", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, None, "messages[0].role",
     None),
    ("content-not-text", "POST", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, None, None, None),
    ("image-content", "POST", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]), 400, "unsupported_content",
     "messages[0].content[0].type", None),
    ("temperature-string", "POST", CHAT, chat(temperature="hot"), 400, "invalid_type", "temperature", None),
    ("temperature-too-high", "POST", CHAT, chat(temperature=3), 400, None, "temperature", None),
    ("top-p-zero", "POST", CHAT, chat(top_p=0), 400, None, "top_p", None),
    ("n-zero", "POST", CHAT, chat(n=0), 400, None, "n", None),
    ("n-over-limit", "POST", CHAT, chat(n=17), 400, "invalid_value", "n", "16"),
    ("max-tokens-zero", "POST", CHAT, chat(max_tokens=0), 400, None, "max_tokens", None),
    ("max-tokens-over-limit", "POST", CHAT, chat(max_tokens=100_000), 400, "invalid_value", "max_tokens", "1024"),
    ("max-tokens-bool", "POST", CHAT, chat(max_tokens=True), 400, "invalid_type", "max_tokens", None),
    ("max-tokens-disagree", "POST", CHAT, chat(max_tokens=4, max_completion_tokens=8), 400, "invalid_value",
     "max_completion_tokens", None),
    ("seed-string", "POST", CHAT, chat(seed="abc"), 400, "invalid_type", "seed", None),
    ("seed-float", "POST", CHAT, chat(seed=1.5), 400, "invalid_type", "seed", None),
    ("seed-too-big", "POST", CHAT, chat(seed=2**70), 400, None, "seed", None),
    ("too-many-stops", "POST", CHAT, chat(stop=["a", "b", "c", "d", "e"]), 400, "invalid_value", "stop", None),
    ("empty-stop", "POST", CHAT, chat(stop=[""]), 400, "invalid_value", "stop[0]", None),
    ("unknown-model", "POST", CHAT, chat(model="gpt-9"), 404, "model_not_found", "model", "gpt-9"),
    ("unknown-sampler", "POST", CHAT, chat(sampler="magic"), 400, "invalid_value", "sampler", "magic"),
    ("logprobs", "POST", CHAT, chat(logprobs=True), 400, "unsupported_parameter", "logprobs", None),
    ("frequency-penalty", "POST", CHAT, chat(frequency_penalty=0.5), 400, "unsupported_parameter",
     "frequency_penalty", None),
    ("logit-bias", "POST", CHAT, chat(logit_bias={"1": 5}), 400, "unsupported_parameter", "logit_bias", None),
    ("stream-options-without-stream", "POST", CHAT, chat(stream_options={"include_usage": True}), 400,
     "invalid_value", "stream_options", None),
    ("response-format-type", "POST", CHAT, chat(response_format={"type": "yaml"}), 400, None,
     "response_format.type", None),
    ("json-schema-missing", "POST", CHAT, chat(response_format={"type": "json_schema"}), 400,
     "missing_required_parameter", "response_format.json_schema", None),
    ("json-schema-typo", "POST", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "s", "shema": {}}}), 400, "unknown_parameter", "response_format.json_schema.shema", None),
    ("json-object-with-schema", "POST", CHAT, chat(response_format={"type": "json_object", "json_schema": {
        "name": "s", "schema": {}}}), 400, "invalid_value", "response_format.json_schema", None),
    ("schema-not-object", "POST", CHAT, chat(response_format=schema_format(5)), 400, "invalid_type",
     "response_format.json_schema.schema", None),
    ("schema-unsupported-keyword", "POST", CHAT, chat(response_format=schema_format(LOOKAHEAD_SCHEMA)), 400,
     "unsupported_schema", "response_format.json_schema.schema", "#/properties/a"),
    ("schema-malformed", "POST", CHAT, chat(response_format=schema_format({"type": 5})), 400, "invalid_constraint",
     "response_format.json_schema.schema", "#/type"),
    ("schema-empty-language", "POST", CHAT, chat(response_format=schema_format(
        {"type": "integer", "minimum": 3, "maximum": 2})), 400, "empty_language", None, None),
    ("schema-too-deep", "POST", CHAT, chat(response_format=schema_format(nested(100))), 422, "constraint_too_complex",
     "response_format.json_schema.schema", "64"),
    ("schema-too-big", "POST", CHAT, chat(response_format=schema_format(
        {"enum": [f"value-number-{i:06d}" for i in range(4000)]})), 422, "constraint_too_complex", None, "bytes"),
    ("stop-with-schema", "POST", CHAT, chat(stop=["}"], response_format={"type": "json_object"}), 400,
     "invalid_value", "stop", None),
    ("two-constraints", "POST", CHAT, chat(response_format={"type": "json_object"},
                                           structured_outputs={"regex": "a+"}), 400, "invalid_value", None, None),
    ("structured-two-fields", "POST", CHAT, chat(structured_outputs={"regex": "a", "choice": ["a"]}), 400,
     "invalid_value", "structured_outputs", None),
    ("structured-empty", "POST", CHAT, chat(structured_outputs={}), 400, "invalid_value", "structured_outputs", None),
    ("structured-unknown-key", "POST", CHAT, chat(structured_outputs={"structural_tag": "x"}), 400,
     "unknown_parameter", "structured_outputs.structural_tag", None),
    ("choice-empty", "POST", CHAT, chat(structured_outputs={"choice": []}), 400, "invalid_value",
     "structured_outputs.choice", None),
    ("choice-not-strings", "POST", CHAT, chat(structured_outputs={"choice": [1, 2]}), 400, "invalid_type", None,
     None),
    ("whitespace-with-regex", "POST", CHAT, chat(structured_outputs={"regex": "a", "whitespace": "flexible"}), 400,
     "invalid_value", "structured_outputs.whitespace", None),
    ("gbnf-syntax-error", "POST", CHAT, chat(structured_outputs={"grammar": 'root ::= "a" | ("b"'}), 400,
     "grammar_syntax_error", "structured_outputs.grammar", "line 1 column"),
    ("gbnf-undefined-rule", "POST", CHAT, chat(structured_outputs={"grammar": "root ::= item\nitm ::= \"x\""}), 400,
     "grammar_syntax_error", "structured_outputs.grammar", "line 1 column 10"),
    ("lark-undefined-rule", "POST", CHAT, chat(structured_outputs={"grammar": "start: foo"}), 400,
     "grammar_syntax_error", "structured_outputs.grammar", "line 1 column 8"),
    ("grammar-unrecognised", "POST", CHAT, chat(structured_outputs={"grammar": "just some words"}), 400,
     "invalid_grammar", "structured_outputs.grammar", None),
    ("regex-syntax-error", "POST", CHAT, chat(structured_outputs={"regex": "(ab"}), 400, "grammar_syntax_error",
     "structured_outputs.regex", None),
    ("regex-lookahead", "POST", CHAT, chat(structured_outputs={"regex": "(?=a)b"}), 400, "unsupported_grammar",
     "structured_outputs.regex", "lookahead"),
    ("regex-dfa-blowup", "POST", CHAT, chat(structured_outputs={"regex": "(a|b)*a(a|b){24}"}), 422,
     "constraint_too_complex", "structured_outputs.regex", "max_dfa_states"),
    ("tool-choice-unknown-function", "POST", CHAT, chat(tools=[TOOL], tool_choice={
        "type": "function", "function": {"name": "nope"}}), 400, "invalid_value", "tool_choice.function.name", None),
    ("tool-choice-required-no-tools", "POST", CHAT, chat(tool_choice="required"), 400, "invalid_value",
     "tool_choice", None),
    ("tool-bad-name", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "bad name!"}}],
                                         tool_choice="required"), 400, None, "tools[0].function.name", None),
    ("tool-duplicate-names", "POST", CHAT, chat(tools=[TOOL, TOOL], tool_choice="required"), 400, "invalid_value",
     "tools", None),
    ("tool-unsupported-parameters", "POST", CHAT, chat(tools=[TOOL, BAD_TOOL], tool_choice="required"), 400,
     "unsupported_schema", "tools[1].function.parameters", "pattern"),
    ("tool-named-unsupported-parameters", "POST", CHAT, chat(tools=[BAD_TOOL], tool_choice={
        "type": "function", "function": {"name": "g"}}), 400, "unsupported_schema", "tools[0].function.parameters",
     None),
    ("prompt-over-context", "POST", CHAT, chat(messages=[{"role": "user", "content": "hello " * 3000}]), 400,
     "context_length_exceeded", "messages", None),
    ("max-tokens-over-context", "POST", CHAT, chat(max_tokens=1024), 400, "context_length_exceeded", "max_tokens",
     None),
    ("stream-with-bad-schema", "POST", CHAT, chat(stream=True, response_format=schema_format(LOOKAHEAD_SCHEMA)), 400,
     "unsupported_schema", None, None),
    ("smc-with-stop", "POST", CHAT, chat(sampler="smc", stop=["x"]), 400, "invalid_value", "stop", None),
    ("body-too-large", "POST", CHAT, b'{"model": "' + b"x" * (1 << 20) + b'"}', 413, "request_too_large", None, None),
    ("wrong-method", "GET", CHAT, None, 405, "method_not_allowed", None, None),
    ("unknown-route", "POST", "/v1/nothing-here", {}, 404, "unknown_url", None, "/v1/nothing-here"),
    ("completion-empty-prompt-list", "POST", COMPLETIONS, completion(prompt=[]), 400, "invalid_value", "prompt",
     None),
    ("completion-token-out-of-range", "POST", COMPLETIONS, completion(prompt=[1, 10**7]), 400, "invalid_value",
     "prompt", None),
    ("completion-suffix", "POST", COMPLETIONS, completion(suffix="}"), 400, "unsupported_parameter", "suffix", None),
    ("completion-best-of", "POST", COMPLETIONS, completion(best_of=3), 400, "unsupported_parameter", "best_of", None),
    ("completion-too-many-prompts", "POST", COMPLETIONS, completion(prompt=["a"] * 65), 400, "invalid_value",
     "prompt", None),
    ("completion-bad-prompt-type", "POST", COMPLETIONS, completion(prompt={"text": "a"}), 400, None, "prompt", None),
    ("infill-one-segment", "POST", "/infill", {"segments": ["only"]}, 400, "invalid_value", "segments", None),
    ("infill-nothing", "POST", "/infill", {}, 400, "missing_required_parameter", None, None),
    ("infill-grammar-unrecognised", "POST", "/infill", {"segments": ["a", "b"], "grammar": "words only"}, 400,
     "invalid_grammar", "grammar", None),
    ("infill-grammar-and-schema", "POST", "/infill", {"segments": ["a", "b"], "grammar": "cpp", "json_schema": {}},
     400, "invalid_value", "json_schema", None),
    ("infill-unknown-field", "POST", "/infill", {"segments": ["a", "b"], "holes": 3}, 400, "unknown_parameter",
     "holes", None),
]


def _check_error(response, status, code, param, text):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error = body["error"]
    assert error["message"] and isinstance(error["message"], str)
    assert error["type"] == ("authentication_error" if status == 401 else "invalid_request_error")
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    if text is not None:
        assert text in error["message"], error


def test_there_are_at_least_forty_kinds_of_bad_input():
    assert len({case[0] for case in CASES}) == len(CASES) >= 40


@pytest.mark.parametrize(("name", "method", "path", "body", "status", "code", "param", "text"), CASES,
                         ids=[case[0] for case in CASES])
def test_bad_input(http, server, name, method, path, body, status, code, param, text):
    if body is None:
        response = http.request(method, path)
    elif isinstance(body, bytes):
        response = http.request(method, path, content=body, headers={"Content-Type": "application/json"})
    else:
        response = http.request(method, path, json=body)
    _check_error(response, status, code, param, text)
    health = server.health()
    assert health["status"] == "ok" and health["worker_alive"], health


@pytest.mark.parametrize(
    ("headers", "code"),
    [({}, "missing_api_key"), ({"Authorization": "Bearer wrong"}, "invalid_api_key"),
     ({"Authorization": f"Basic {API_KEY}"}, "invalid_api_key")],
    ids=["missing", "wrong", "not-bearer"],
)
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, "/v1/models", "/infill"])
def test_api_key_required(server, headers, code, path):
    import httpx

    method = "GET" if path == "/v1/models" else "POST"
    response = httpx.request(method, server.base_url + path, headers=headers, timeout=30,
                             content=json.dumps(BASE) if method == "POST" else None)
    _check_error(response, 401, code, None, None)
    assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200  # /health needs no key


def test_openai_client_raises_typed_errors(client, server):
    import openai
    from openai import OpenAI

    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL_NAME, messages=BASE["messages"],
                                       response_format=schema_format(LOOKAHEAD_SCHEMA))
    assert bad.value.code == "unsupported_schema" and "#/properties/a" in bad.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=BASE["messages"])
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model=MODEL_NAME, messages=BASE["messages"],
                                       extra_body={"structured_outputs": {"regex": "(a|b)*a(a|b){24}"}})
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0).models.list()
