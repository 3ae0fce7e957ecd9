"""The server's pieces in process, without sockets or weights: the continuous-batching scheduler
draws exactly what ``engine.generate`` draws (rows joining mid-batch included), a failing model
call or row does not kill the worker, the compile service's budget, cache and single flight,
grammar-syntax detection, the plain chat format and tool-call helpers."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import torch

from engine import ScriptedLM, generate
from grammars import Compiler
from samplers import SamplingParams
from server.chat import PromptEncoder, parse_tool_calls, tool_param, tool_spec
from server.config import ServerConfig
from server.constraints import (
    CompileService,
    ConstraintSpec,
    check_bounds,
    detect_grammar_syntax,
    schema_spec,
)
from server.protocol import ApiError, ChatCompletionRequest, Message, Tool
from server.runtime import Generation, Runtime

pytest.importorskip("grammars.frontends.json_schema")

SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}, "b": {"type": "integer"}},
          "required": ["a", "b"], "additionalProperties": False}
LIST = r"[a-z]{1,6}(,[a-z]{1,6}){0,3}"


def random_lm(vocab, scale: float = 3.0, fail_on: bytes | None = None) -> ScriptedLM:
    """Pseudo-random logits per prefix (a function of the prefix alone, so batch composition
    cannot change a draw); ``fail_on``: raise for prefixes whose prompt starts with those bytes."""

    def script(prefix):
        if fail_on is not None and bytes(prefix[: len(fail_on)]) == fail_on:
            raise RuntimeError("scripted model failure")
        gen = torch.Generator().manual_seed(hash(prefix) % (2**31))
        return torch.randn(vocab.logits_width, generator=gen) * scale

    return ScriptedLM(vocab.logits_width, script)


class Collector:
    """A ticket sink that records events from the worker thread and says when all are done."""

    def __init__(self, total: int):
        self.total = total
        self.texts: dict[int, str] = {}
        self.results: dict[int, dict] = {}
        self.done = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, events):
        with self.lock:
            for kind, index, payload in events:
                if kind == "delta":
                    self.texts[index] = self.texts.get(index, "") + payload
                else:
                    self.results[index] = payload
            if len(self.results) == self.total:
                self.done.set()


@pytest.fixture
def runtime(byte_vocab):
    made = []

    def make(lm=None, **settings):
        config = ServerConfig(model="scripted", **settings)
        rt = Runtime(config, lm if lm is not None else random_lm(byte_vocab), byte_vocab)
        rt.start()
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()


def _grammar(rt, kind):
    spec = schema_spec(SCHEMA, "schema") if kind == "schema" else ConstraintSpec("regex", LIST, (), "regex")
    return rt.compiles.compile_sync(spec)


def _expected(rt, prompt, kind, sampler, seed, max_tokens, temperature=1.0):
    constraint = {"schema": SCHEMA} if kind == "schema" else {"regex": LIST}
    return generate(list(prompt), model=rt.lm, tokenizer=rt.vocab, compiler=rt.compiler, sampler=sampler,
                    seed=seed, max_tokens=max_tokens, temperature=temperature, **constraint)


@pytest.mark.parametrize("sampler", ["masked", "awrs", "asap", "smc"])
def test_scheduler_draws_what_engine_generate_draws(runtime, sampler):
    """Requests joining a running batch at different steps, with different constraints, budgets
    and seeds: every sequence equals ``engine.generate`` run alone with the same seed."""
    rt = runtime(join_wait_ms=0.0)
    cases = []  # (prompt, kind, max_tokens, seed, n)
    for i in range(6):
        cases.append(((b"P%d:" % i), "schema" if i % 2 else "regex", 12 + 7 * i, 100 + 10 * i, 1 + (i % 2)))
    collectors = []
    for prompt, kind, max_tokens, seed, n in cases:
        gen = Generation([list(prompt)], n, _grammar(rt, kind), sampler, SamplingParams(), seed, max_tokens)
        sink = Collector(n)
        rt.submit(gen, sink)
        collectors.append(sink)
        time.sleep(0.01)  # the next request joins while this one runs
    for sink in collectors:
        assert sink.done.wait(60), "a request never finished"
    for (prompt, kind, max_tokens, seed, n), sink in zip(cases, collectors):
        for j in range(n):
            want = _expected(rt, prompt, kind, sampler, seed + j, max_tokens)
            got = sink.results[j]
            assert got["token_ids"] == want.token_ids, (prompt, j)
            assert got["text"] == want.text == sink.texts.get(j, "")
            expected_finish = "stop" if want.finish_reason in ("stop", "stop_string") else want.finish_reason
            assert ("stop" if got["finish"] in ("stop", "stop_string") else got["finish"]) == expected_finish
    assert rt.scheduler.snapshot()["max_batch_seen"] >= 2


def test_unconstrained_and_greedy_rows_match_too(runtime):
    rt = runtime()
    sink = Collector(2)
    rt.submit(Generation([list(b"Q:")], 2, None, "masked", SamplingParams(temperature=0.0), 5, 9), sink)
    assert sink.done.wait(30)
    want = generate(list(b"Q:"), model=rt.lm, tokenizer=rt.vocab, seed=5, max_tokens=9, temperature=0.0)
    assert sink.results[0]["token_ids"] == sink.results[1]["token_ids"] == want.token_ids


def test_stop_strings_never_stream_text_that_is_cut(runtime, byte_vocab):
    rt = runtime()
    stops = ("ab", "b,")
    for seed in range(8):
        sink = Collector(1)
        gen = Generation([list(b"S:")], 1, rt.compiles.compile_sync(ConstraintSpec("regex", "[ab,]{5,40}", (), "r")),
                         "masked", SamplingParams(), seed, 40, stops)
        rt.submit(gen, sink)
        assert sink.done.wait(30)
        text = sink.texts.get(0, "")
        assert text == sink.results[0]["text"]
        assert not any(s in text for s in stops)
        want = generate(list(b"S:"), model=rt.lm, tokenizer=rt.vocab, compiler=rt.compiler, regex="[ab,]{5,40}",
                        seed=seed, max_tokens=40, stop=list(stops))
        assert text == want.text


def test_a_failing_model_call_fails_its_step_not_the_worker(runtime, byte_vocab):
    rt = runtime(lm=random_lm(byte_vocab, fail_on=b"BAD"))
    bad, good = Collector(1), Collector(1)
    rt.submit(Generation([list(b"BAD prompt")], 1, None, "masked", SamplingParams(), 1, 8), bad)
    assert bad.done.wait(30)
    assert bad.results[0]["finish"] == "error" and "scripted model failure" in str(bad.results[0]["error"])
    rt.submit(Generation([list(b"good")], 1, None, "masked", SamplingParams(), 1, 8), good)
    assert good.done.wait(30)
    assert good.results[0]["finish"] in ("stop", "length")
    assert rt.scheduler.alive


def test_cancelled_tickets_leave_the_batch(runtime):
    rt = runtime()
    sink = Collector(1)
    ticket = rt.submit(Generation([list(b"long")], 1, None, "masked", SamplingParams(), 1, 100_000, (), True), sink)
    time.sleep(0.2)
    ticket.cancel()
    deadline = time.monotonic() + 10
    while rt.scheduler.snapshot()["active"] and time.monotonic() < deadline:
        time.sleep(0.02)
    snap = rt.scheduler.snapshot()
    assert snap["active"] == 0 and snap["sequences_cancelled"] == 1


def test_max_batch_one_runs_sequences_one_at_a_time(runtime):
    rt = runtime(max_batch=1)
    sinks = [Collector(1) for _ in range(3)]
    for i, sink in enumerate(sinks):
        rt.submit(Generation([list(b"x%d" % i)], 1, None, "masked", SamplingParams(), i, 6), sink)
    for sink in sinks:
        assert sink.done.wait(30)
    assert rt.scheduler.snapshot()["max_batch_seen"] == 1


def test_queue_bound_answers_429(runtime):
    rt = runtime(max_batch=1, max_queued=2)
    gen = Generation([list(b"q")], 1, None, "masked", SamplingParams(), 1, 100_000, (), True)
    first = rt.submit(gen, Collector(1))
    time.sleep(0.1)
    rt.submit(gen, Collector(1))
    rt.submit(gen, Collector(1))
    with pytest.raises(ApiError) as exc:
        rt.submit(gen, Collector(1))
    assert exc.value.status == 429
    first.cancel()


# --- the compile service -----------------------------------------------------------------------------


class SlowService(CompileService):
    def __init__(self, *args, delay: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.compiled = 0

    def _compile(self, spec):
        time.sleep(self.delay)
        self.compiled += 1
        return super()._compile(spec)


def test_compile_budget_is_a_422_and_the_result_lands_in_the_cache(byte_vocab):
    service = SlowService(Compiler(byte_vocab), timeout_s=0.05, delay=0.5)
    spec = ConstraintSpec("regex", "[0-9]+", (), "structured_outputs.regex")
    try:
        with pytest.raises(ApiError) as exc:
            asyncio.run(service.compile(spec))
        assert exc.value.status == 422 and exc.value.code == "compile_timeout"
        assert exc.value.param == "structured_outputs.regex"
        time.sleep(1.0)  # the compilation went on in the background
        service.timeout_s = 5
        assert asyncio.run(service.compile(spec)) is not None
        assert service.compiled == 1 and service.stats()["hits"] == 1
    finally:
        service.close()


def test_single_flight_and_cached_failures(byte_vocab):
    service = SlowService(Compiler(byte_vocab), timeout_s=10, delay=0.2)
    try:
        async def both(spec):
            return await asyncio.gather(service.compile(spec), service.compile(spec))

        a, b = asyncio.run(both(ConstraintSpec("regex", "x+", (), "r")))
        assert a is b and service.compiled == 1
        bad = schema_spec({"type": "string", "pattern": "(?=a)"}, "schema")
        for _ in range(2):
            with pytest.raises(ApiError) as exc:
                asyncio.run(service.compile(bad))
            assert exc.value.status == 400 and exc.value.code == "unsupported_schema"
        assert service.compiled == 2  # the failure was compiled once and then served from the cache
    finally:
        service.close()


def test_schema_key_order_is_kept():
    """Property order is part of a JSON Schema constraint (it is the order generated)."""
    spec = schema_spec({"properties": {"z": {}, "a": {}}}, "s")
    assert spec.source.index('"z"') < spec.source.index('"a"')


@pytest.mark.parametrize(
    ("spec", "status"),
    [(schema_spec({"enum": ["x" * 100] * 20}, "s"), 422), (ConstraintSpec("choice", json.dumps(["a"] * 10), (), "c"), 422),
     (schema_spec({"items": {"items": {"items": {}}}}, "s"), 422)],
)
def test_bounds(spec, status):
    with pytest.raises(ApiError) as exc:
        check_bounds(spec, max_bytes=1000, max_depth=3, max_choices=5)
    assert exc.value.status == status and exc.value.code == "constraint_too_complex"


@pytest.mark.parametrize(
    ("text", "kind"),
    [('root ::= "a"', "gbnf"), ('# c\nroot   ::= x\nx ::= "b"', "gbnf"), ("start: A\nA: /a/", "lark"),
     ('?start: "x"', "lark"), ("%import common.NUMBER\nstart: NUMBER", "lark"), ("start: a\na: \"::=\"", "lark")],
)
def test_grammar_syntax_detection(text, kind):
    assert detect_grammar_syntax(text) == kind


def test_undetectable_grammar_is_400():
    with pytest.raises(ApiError) as exc:
        detect_grammar_syntax("hello there")
    assert exc.value.status == 400 and exc.value.code == "invalid_grammar"


# --- prompts and tools --------------------------------------------------------------------------------


def test_plain_chat_format_without_a_template(byte_vocab):
    encoder = PromptEncoder(byte_vocab)
    messages = [Message(role="system", content="Be terse."), Message(role="user", content="Hi"),
                Message.model_validate({"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
                Message(role="tool", content="42", tool_call_id="c1")]
    ids = encoder.encode_chat(messages, None)
    assert byte_vocab.decode(ids) == (b'System: Be terse.\nUser: Hi\nAssistant: <tool_call>{"name": "f", "arguments": "{}"}'
                          b"</tool_call>\nTool [c1]: 42\nAssistant:")


def test_tool_helpers():
    tools = [Tool.model_validate({"type": "function", "function": {"name": "a"}}),
             Tool.model_validate({"type": "function", "function": {"name": "b", "parameters": {
                 "type": "object", "properties": {"x": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "integer"}}}}})]
    spec = tool_spec(tools, "required", None)
    schema = json.loads(spec.source)
    assert schema["items"]["anyOf"][1]["properties"]["parameters"]["$id"] == "urn:corral:tool:1"
    assert tool_param("unsupported keyword 'pattern' at #/items/anyOf/1/properties/parameters/x", 2) == \
        "tools[1].function.parameters"
    calls = parse_tool_calls('[{"name":"b","parameters":{"x":1}},{"name":"a","parameters":{}}]', "required", None)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("b", '{"x":1}'), ("a", "{}")]
    assert parse_tool_calls('{"x": 1}', "named", "b")[0]["function"] == {"name": "b", "arguments": '{"x": 1}'}
    assert parse_tool_calls('[{"name":"b"', "required", None) is None


def test_request_models_are_strict():
    from server.protocol import validate

    with pytest.raises(ApiError) as exc:
        validate(ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                         "response_format": {"type": "json_schema", "json_schema": {
                                             "name": "n", "schema": {}, "stric": True}}})
    assert exc.value.code == "unknown_parameter" and exc.value.param == "response_format.json_schema.stric"
