"""Concurrency over loopback: 64 simultaneous requests, each with its own schema, all complete
with outputs valid against *their own* schema (nothing lost, nothing mixed), batched together;
a client that disconnects frees its slot."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import jsonschema
from serve_helpers import API_KEY, MODEL_NAME

N_REQUESTS = 64


def schema_for(i: int) -> dict:
    """A schema only request ``i``'s output satisfies: its own required key and value type."""
    kinds = [
        {"type": "integer", "minimum": i, "maximum": i + 9},
        {"enum": [f"v{i}", f"w{i}"]},
        {"type": "boolean"},
        {"type": "string", "maxLength": 6},
        {"type": "array", "items": {"type": "integer", "minimum": -99, "maximum": 99}, "maxItems": 3},
        {"const": i},
    ]
    return {"type": "object", "properties": {f"field_{i}": kinds[i % len(kinds)]}, "required": [f"field_{i}"],
            "additionalProperties": False}


async def _one(client, i: int) -> tuple[int, str, str]:
    kwargs = dict(model=MODEL_NAME, messages=[{"role": "user", "content": f"Request number {i}"}], max_tokens=48,
                  seed=i, response_format={"type": "json_schema", "json_schema": {"name": f"s{i}",
                                                                                  "schema": schema_for(i)}})
    if i % 4 == 3:  # a quarter of them stream
        text, finish = "", None
        async for chunk in await client.chat.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        return i, text, finish
    out = await client.chat.completions.create(**kwargs)
    return i, out.choices[0].message.content, out.choices[0].finish_reason


async def _all(base_url: str):
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=300) as client:
        return await asyncio.gather(*(_one(client, i) for i in range(N_REQUESTS)))


def test_64_concurrent_requests_each_valid_against_its_own_schema(server):
    before = server.health()
    started = time.monotonic()
    results = asyncio.run(_all(server.base_url))
    elapsed = time.monotonic() - started
    assert sorted(i for i, _, _ in results) == list(range(N_REQUESTS))
    for i, text, finish in results:
        assert finish == "stop", (i, text)
        value = json.loads(text)
        jsonschema.validate(value, schema_for(i))  # its own key, its own type: not another request's output
        assert list(value) == [f"field_{i}"]
    after = server.health()
    assert after["sequences_finished"] - before["sequences_finished"] >= N_REQUESTS
    assert after["active"] == 0 and after["queued"] == 0
    assert after["max_batch_seen"] >= 8, after  # requests shared forward passes
    print(f"{N_REQUESTS} requests in {elapsed:.1f} s; largest batch {after['max_batch_seen']}")


def _wait_until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_disconnected_stream_frees_its_slot(server):
    before = server.health()["sequences_cancelled"]
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Talk."}], "max_tokens": 1000,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        assert response.status_code == 200
        seen = 0
        for line in response.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 3:
                break  # leave mid-stream: closing the response closes the connection
    assert _wait_until(lambda: server.health()["sequences_cancelled"] > before), server.health()
    assert _wait_until(lambda: server.health()["active"] == 0), server.health()


def test_disconnected_plain_request_frees_its_slot(server):
    before = server.health()["sequences_cancelled"]
    body = {"model": MODEL_NAME, "prompt": "Talk.", "max_tokens": 1000, "ignore_eos": True}
    try:
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=0.5,
                   headers={"Authorization": f"Bearer {API_KEY}"})
    except httpx.TimeoutException:
        pass  # the client gave up and closed the connection
    assert _wait_until(lambda: server.health()["sequences_cancelled"] > before), server.health()
    assert _wait_until(lambda: server.health()["active"] == 0), server.health()
