"""The server over real sockets with the official ``openai`` client: structured outputs validate,
streams reassemble to the non-streamed text, tool calls parse and validate, samplers and
endpoints answer as OpenAI's do."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from serve_helpers import API_KEY, MODEL_NAME

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "email": {"type": "string", "format": "email"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
SCHEMAS = {
    "person": PERSON,
    "enum-array": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
    "nested": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999}, "tags": {
        "type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        "when": {"type": "string", "format": "date"}}, "required": ["id", "tags", "when"],
        "additionalProperties": False},
    "anyof-ref": {"$defs": {"point": {"type": "object", "properties": {"x": {"enum": [0.5, -2.25, 1e3]},
                                                                    "y": {"type": "integer", "minimum": 0, "maximum": 99}},
                                      "required": ["x", "y"], "additionalProperties": False}},
                  "anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}, {"const": "origin"}]},
}
#: no numbers: a random model writes integers like ``-0E830450992`` (zero, so valid) until
#: budget-aware closing stops it, which is slow on a 50k vocabulary (see the server report)
CARD = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}, "ok": {"type": "boolean"},
                                         "note": {"type": "string", "maxLength": 8}},
        "required": ["colour", "ok", "note"], "additionalProperties": False}
MESSAGES = [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Describe someone."}]


def _validate(value, schema):
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    health = server.health()
    assert health["status"] == "ok" and health["worker_alive"]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_validate(client, name):
    schema = SCHEMAS[name]
    for seed in range(2):
        out = client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=96, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        )
        choice = out.choices[0]
        assert choice.finish_reason == "stop", choice
        _validate(json.loads(choice.message.content), schema)
        assert out.usage.completion_tokens >= 1
        assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_json_object(client):
    out = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=48, seed=4,
                                         response_format={"type": "json_object"})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content), dict)


@pytest.mark.parametrize(
    ("field", "value", "check"),
    [
        ("regex", r"[a-z]{2,8}@[a-z]{2,6}\.(com|org)", lambda t: re.fullmatch(r"[a-z]{2,8}@[a-z]{2,6}\.(com|org)", t)),
        ("choice", ["yes", "no", "maybe so"], lambda t: t in ("yes", "no", "maybe so")),
        ("grammar", 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]{0,2}',
         lambda t: re.fullmatch(r"\([1-9][0-9]{0,2}(\+[1-9][0-9]{0,2})*\)", t)),
        ("grammar", 'start: "<" WORD ("," WORD)* ">"\nWORD: /[a-z]{1,6}/',
         lambda t: re.fullmatch(r"<[a-z]{1,6}(,[a-z]{1,6})*>", t)),
        ("json", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}, lambda t: isinstance(json.loads(t)["ok"], bool)),
    ],
    ids=["regex", "choice", "gbnf", "lark", "json"],
)
def test_structured_outputs_extra_field(client, field, value, check):
    for seed in range(2):
        out = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=40, seed=seed,
                                             extra_body={"structured_outputs": {field: value}})
        choice = out.choices[0]
        assert choice.finish_reason == "stop", choice
        assert check(choice.message.content), choice.message.content


def test_completions_endpoint(client):
    out = client.completions.create(model=MODEL_NAME, prompt=["A card: ", "Another: "], n=2, max_tokens=64, seed=7,
                                    extra_body={"response_format": {"type": "json_schema",
                                                                    "json_schema": {"name": "c", "schema": CARD}}})
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    for c in out.choices:
        assert c.finish_reason == "stop"
        _validate(json.loads(c.text), CARD)
    assert out.usage.prompt_tokens > 0


def test_completions_token_prompt_and_echo(client, http):
    out = client.completions.create(model=MODEL_NAME, prompt=[464, 3290], max_tokens=5, seed=1,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5
    echoed = client.completions.create(model=MODEL_NAME, prompt="Echo me:", max_tokens=3, seed=1, echo=True)
    assert echoed.choices[0].text.startswith("Echo me:")


def test_max_tokens_finish_length_and_usage(client):
    out = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_completion_tokens=6, seed=3,
                                         extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 6


def test_same_seed_same_output(client):
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=24, seed=11, temperature=0.9, top_p=0.95)
    a = client.chat.completions.create(**kwargs).choices[0].message.content
    b = client.chat.completions.create(**kwargs).choices[0].message.content
    assert a == b


def _stream_chat(client, **kwargs) -> tuple[dict[int, str], dict[int, str], object]:
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    return texts, finishes, usage


@pytest.mark.parametrize("constrained", [False, True], ids=["text", "schema"])
def test_stream_reassembles_to_the_same_text(client, constrained):
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=40, seed=21, n=2)
    if constrained:
        kwargs["response_format"] = {"type": "json_schema", "json_schema": {"name": "c", "schema": CARD}}
    whole = client.chat.completions.create(**kwargs)
    texts, finishes, usage = _stream_chat(client, **kwargs)
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_stream_with_stop_strings_matches(client):
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=60, seed=5, stop=["ab", "ba"],
                  extra_body={"structured_outputs": {"regex": "[ab ]{30,60}"}})
    whole = client.chat.completions.create(**kwargs).choices[0]
    texts, finishes, _ = _stream_chat(client, **kwargs)
    assert texts[0] == whole.message.content
    assert "ab" not in whole.message.content and "ba" not in whole.message.content
    assert whole.finish_reason == finishes[0] == "stop"


def test_completions_stream_matches(client):
    kwargs = dict(model=MODEL_NAME, prompt="Once upon a time", max_tokens=20, seed=2, n=2)
    whole = client.completions.create(**kwargs)
    texts: dict[int, str] = {}
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in whole.choices}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"$ref": "#/$defs/city"},
                                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False,
                       "$defs": {"city": {"type": "string", "minLength": 1, "maxLength": 10}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"], "additionalProperties": False}}}
NOARGS = {"type": "function", "function": {"name": "ping"}}
TOOLS = {t["function"]["name"]: t for t in (WEATHER, TIME, NOARGS)}


def _check_call(call):
    tool = TOOLS[call.function.name]
    params = tool["function"].get("parameters", {"type": "object", "properties": {}, "additionalProperties": False})
    _validate(json.loads(call.function.arguments), params)
    assert call.type == "function" and call.id.startswith("call_")


def test_tool_choice_required(client):
    for seed in range(3):
        out = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Weather?"}],
                                             tools=[WEATHER, TIME, NOARGS], tool_choice="required", max_tokens=80,
                                             seed=seed)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and choice.message.tool_calls
        for call in choice.message.tool_calls:
            _check_call(call)


def test_tool_choice_named_and_streamed(client):
    kwargs = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "Weather in Paris?"}],
                  tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  max_tokens=60, seed=3)
    out = client.chat.completions.create(**kwargs)
    calls = out.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    _check_call(calls[0])
    arguments, name = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            for call in c.delta.tool_calls or ():
                name = call.function.name or name
                arguments += call.function.arguments or ""
    assert name == "get_weather" and arguments == calls[0].function.arguments


def test_tool_conversation_round_trip(client):
    """An assistant tool call and the tool's answer in the history are accepted and rendered."""
    messages = [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz":"UTC"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    out = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=[TIME], tool_choice="none",
                                         max_tokens=5, seed=0)
    assert out.choices[0].message.tool_calls is None


@pytest.mark.parametrize("sampler", ["masked", "asap", "awrs", "smc"])
def test_samplers(client, sampler):
    pattern = r"(cat|dog|bird)s?( and (cat|dog|bird)s?){0,2}"
    out = client.completions.create(model=MODEL_NAME, prompt="Pets:", max_tokens=24, seed=1,
                                    extra_body={"sampler": sampler, "structured_outputs": {"regex": pattern}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    assert re.fullmatch(pattern, choice.text), choice.text


INFILL_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                 "age": {"type": "integer", "minimum": 0}},
                 "required": ["name", "age"], "additionalProperties": False}


def test_infill_segments_under_a_schema(http):
    import engine

    body = {"segments": ['{"name":"', '","age":', "}"], "json_schema": INFILL_SCHEMA, "max_tokens_per_hole": 8,
            "seed": 3}
    response = http.post("/infill", json=body)
    if not hasattr(engine, "infill"):
        assert response.status_code == 501 and response.json()["error"]["code"] == "not_implemented"
        return
    assert response.status_code == 200, response.text
    out = response.json()
    assert len(out["fills"]) == 2 and out["text"] == '{"name":"' + out["fills"][0] + '","age":' + out["fills"][1] + "}"
    _validate(json.loads(out["text"]), INFILL_SCHEMA)


def test_infill_llama_fields_with_gbnf(http):
    import engine

    if not hasattr(engine, "infill"):
        pytest.skip("engine.infill is not available")
    grammar = 'root ::= "x = " [0-9]+ ";"'
    response = http.post("/infill", json={"input_prefix": "x = ", "input_suffix": ";", "grammar": grammar,
                                          "input_extra": [{"filename": "a.c", "text": "int y;"}],
                                          "max_tokens_per_hole": 6, "seed": 1})
    assert response.status_code == 200, response.text
    out = response.json()
    assert re.fullmatch(r"x = [0-9]+;", out["text"]) and out["content"] == out["fills"][0]


def test_infill_uncompletable_is_400(http):
    import engine

    if not hasattr(engine, "infill"):
        pytest.skip("engine.infill is not available")
    response = http.post("/infill", json={"segments": ["{\"name\":", "}}}"], "json_schema": INFILL_SCHEMA})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "uncompletable"


def test_raw_http_and_sse_format(server):
    import httpx

    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
