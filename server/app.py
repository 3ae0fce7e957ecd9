"""The HTTP surface: an OpenAI-compatible FastAPI app over a ``Runtime``.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (both streaming with
``"stream": true``: server-sent events ending with ``data: [DONE]``), ``GET /v1/models``,
``GET /v1/models/{id}``, ``GET /health`` (no key needed; counters of the scheduler and the compile
cache) and ``POST /infill`` (``engine.infill``: token by token with a causal model, all holes in one
canvas with a masked-diffusion model).

Every request body is read with a size cap (413), parsed (400 with line and column), validated
against ``server.protocol`` (400 naming the field), checked against the server's bounds (400 or
422), its constraint compiled off the event loop (400/422 for bad or oversized constraints), and
only then queued (429 when the queue is full). Errors are always the OpenAI error object; a
request never reaches the model unless all of that passed. A client that disconnects cancels its
sequences: a stream when its generator is closed, a plain request by a watcher polling the
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import engine
from grammars import GrammarError, LimitExceeded
from samplers import SamplingParams
from server.chat import parse_tool_calls, tool_mode, tool_param, tool_spec
from server.config import ServerConfig
from server.constraints import (
    ConstraintSpec,
    check_bounds,
    detect_grammar_syntax,
    schema_spec,
)
from server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    InfillRequest,
    error_body,
    parse_json,
    validate,
)
from server.runtime import SAMPLERS, Generation, Runtime
from server.scheduler import ScheduledLM, ShuttingDown, Ticket

__all__ = ["create_app"]

log = logging.getLogger("server.app")


def create_app(config: ServerConfig, runtime: Runtime | None = None) -> FastAPI:
    """The FastAPI app. Without ``runtime`` the model is loaded at startup (lifespan)."""
    state: dict[str, Runtime] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        rt = runtime if runtime is not None else await asyncio.to_thread(Runtime.load, config)
        rt.start()
        state["rt"] = rt
        try:
            yield
        finally:
            await asyncio.to_thread(rt.close)

    app = FastAPI(title="corral", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def rt() -> Runtime:
        found = state.get("rt")
        if found is None:
            raise ApiError(503, "the model is still loading", code="not_ready")
        return found

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            message = f"Unknown route: {request.method} {request.url.path}"
            code = "unknown_url"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}"
            code = "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        return JSONResponse(error_body(message, param=None, code=code), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):  # the last resort: logged, never a bare 500
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", type="server_error",
                                       code="internal_error"), status_code=500)

    def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise ApiError(401, "You didn't provide an API key: send 'Authorization: Bearer KEY'",
                           code="missing_api_key")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
            raise ApiError(401, "Incorrect API key provided", code="invalid_api_key")

    async def read_body(request: Request) -> dict[str, Any]:
        limit = config.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                if int(declared) > limit:
                    raise ApiError(413, f"The request body is {int(declared)} bytes; the limit is {limit}",
                                   code="request_too_large")
            except ValueError:
                raise ApiError(400, "Content-Length is not a number", code="invalid_request") from None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"The request body exceeds the limit of {limit} bytes", code="request_too_large")
            chunks.append(chunk)
        return parse_json(b"".join(chunks))

    @app.get("/health")
    async def health():
        runtime_ = state.get("rt")
        if runtime_ is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        body = {"status": "shutting_down" if runtime_.closing else "ok", "model": runtime_.model_name,
                "model_kind": "diffusion" if runtime_.diffusion else "causal", **runtime_.scheduler.snapshot(), "compile_cache": runtime_.compiles.stats()}
        return JSONResponse(body, status_code=200 if body["worker_alive"] and not runtime_.closing else 503)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [_model_card(rt())]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        authorize(request)
        if model_id != rt().model_name:
            raise ApiError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
        return _model_card(rt())

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        authorize(request)
        req: ChatCompletionRequest = validate(ChatCompletionRequest, await read_body(request))
        runtime_ = rt()
        plan = await _plan_chat(req, config, runtime_)
        return await _respond(request, runtime_, plan)

    @app.post("/v1/completions")
    async def completions(request: Request):
        authorize(request)
        req: CompletionRequest = validate(CompletionRequest, await read_body(request))
        runtime_ = rt()
        plan = await _plan_completion(req, config, runtime_)
        return await _respond(request, runtime_, plan)

    @app.post("/infill")
    async def infill(request: Request):
        authorize(request)
        req: InfillRequest = validate(InfillRequest, await read_body(request))
        return await _infill(req, config, rt())

    return app


def _model_card(runtime: Runtime) -> dict[str, Any]:
    return {"id": runtime.model_name, "object": "model", "created": 0, "owned_by": "corral",
            "max_model_len": runtime.context_length}


# --- planning a request ---------------------------------------------------------------------------


@dataclass
class _Plan:
    kind: str  # "chat" | "completion"
    gen: Generation
    stream: bool
    include_usage: bool
    tool_mode: str = "none"
    tool_name: str | None = None
    echo: list[str] = field(default_factory=list)


def _check_common(req, config: ServerConfig, runtime: Runtime, max_tokens: int | None, default_tokens: int):
    """Model, n, sampling numbers, stop strings, unsupported OpenAI fields: (n, max_tokens, stop,
    sampler name, SamplingParams)."""
    if req.model != runtime.model_name:
        raise ApiError(404, f"The model '{req.model}' does not exist; this server serves '{runtime.model_name}'",
                       param="model", code="model_not_found")
    n = 1 if req.n is None else req.n
    if n > config.max_n:
        raise ApiError(400, f"n is {n}; this server generates at most {config.max_n} choices per request",
                       param="n", code="invalid_value")
    if max_tokens is not None and max_tokens > config.max_tokens_limit:
        raise ApiError(400, f"max_tokens is {max_tokens}; this server's limit is {config.max_tokens_limit}",
                       param="max_tokens", code="invalid_value")
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(req, name)
        if value not in (None, 0, 0.0):
            raise ApiError(400, f"{name} is not supported (send 0 or leave it out)", param=name,
                           code="unsupported_parameter")
    if req.logit_bias:
        raise ApiError(400, "logit_bias is not supported", param="logit_bias", code="unsupported_parameter")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options",
                       code="invalid_value")
    stop = _stop_strings(req.stop, config)
    sampler = (req.sampler or config.default_sampler).lower()
    if sampler not in SAMPLERS:
        raise ApiError(400, f"unknown sampler {req.sampler!r}; choose one of {list(SAMPLERS)}", param="sampler",
                       code="invalid_value")
    if sampler == "smc" and stop:
        raise ApiError(400, "stop strings cannot be used with the smc sampler", param="stop", code="invalid_value")
    params = SamplingParams(temperature=1.0 if req.temperature is None else float(req.temperature),
                            top_p=1.0 if req.top_p is None else float(req.top_p),
                            top_k=0 if req.top_k is None else req.top_k)
    return n, (default_tokens if max_tokens is None else max_tokens), max_tokens is None, stop, sampler, params


def _stop_strings(stop, config: ServerConfig) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > config.max_stop:
        raise ApiError(400, f"stop has {len(stops)} strings; at most {config.max_stop} are allowed", param="stop",
                       code="invalid_value")
    for i, s in enumerate(stops):
        if not s:
            raise ApiError(400, "stop strings must not be empty", param=f"stop[{i}]" if not isinstance(stop, str)
                           else "stop", code="invalid_value")
        if len(s) > config.max_stop_chars:
            raise ApiError(400, f"a stop string is longer than {config.max_stop_chars} characters", param="stop",
                           code="invalid_value")
    return tuple(stops)


def _constraint(req, config: ServerConfig, tools_spec: ConstraintSpec | None) -> ConstraintSpec | None:
    """The request's one constraint (or none); 400 when it names several or names one badly."""
    found: list[ConstraintSpec] = [] if tools_spec is None else [tools_spec]
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            if fmt.json_schema is not None:
                raise ApiError(400, "response_format.json_schema is only allowed with type 'json_schema'",
                               param="response_format.json_schema", code="invalid_value")
            found.append(schema_spec({"type": "object"}, "response_format"))
        else:
            spec = fmt.json_schema
            if spec is None:
                raise ApiError(400, "response_format of type 'json_schema' needs a json_schema object",
                               param="response_format.json_schema", code="missing_required_parameter")
            if spec.schema_ is None:
                raise ApiError(400, "response_format.json_schema needs a schema", param="response_format.json_schema"
                               ".schema", code="missing_required_parameter")
            found.append(schema_spec(spec.schema_, "response_format.json_schema.schema", lenient=spec.strict is False))
    elif fmt is not None and fmt.json_schema is not None:
        raise ApiError(400, "response_format.json_schema is only allowed with type 'json_schema'",
                       param="response_format.json_schema", code="invalid_value")
    so = req.structured_outputs
    if so is not None:
        given = [name for name in ("json_", "regex", "grammar", "choice", "json_object")
                 if getattr(so, name) not in (None, False)]
        if len(given) != 1:
            names = [g.rstrip("_") for g in given]
            raise ApiError(400, "structured_outputs needs exactly one of json, regex, grammar, choice, json_object"
                           + (f"; got {', '.join(names)}" if names else ""), param="structured_outputs",
                           code="invalid_value")
        kind = given[0]
        if so.whitespace is not None and kind not in ("json_", "json_object"):
            raise ApiError(400, "structured_outputs.whitespace applies to json and json_object only",
                           param="structured_outputs.whitespace", code="invalid_value")
        if kind == "json_":
            found.append(schema_spec(so.json_, "structured_outputs.json", whitespace=so.whitespace))
        elif kind == "json_object":
            found.append(schema_spec({"type": "object"}, "structured_outputs.json_object", whitespace=so.whitespace))
        elif kind == "regex":
            found.append(ConstraintSpec("regex", so.regex, (), "structured_outputs.regex"))
        elif kind == "grammar":
            found.append(ConstraintSpec(detect_grammar_syntax(so.grammar), so.grammar, (),
                                        "structured_outputs.grammar"))
        else:
            if not so.choice:
                raise ApiError(400, "structured_outputs.choice must list at least one string",
                               param="structured_outputs.choice", code="invalid_value")
            found.append(ConstraintSpec("choice", json.dumps(so.choice, ensure_ascii=False), (),
                                        "structured_outputs.choice"))
    if len(found) > 1:
        raise ApiError(400, f"a request takes one constraint; got {' and '.join(s.param for s in found)}",
                       param=found[1].param, code="invalid_value")
    if not found:
        return None
    spec = found[0]
    check_bounds(spec, max_bytes=config.max_constraint_bytes, max_depth=config.max_schema_depth,
                 max_choices=config.max_choices)
    return spec


def _fit_context(prompts: list[list[int]], max_tokens: int, defaulted: bool, runtime: Runtime, param: str) -> int:
    limit = runtime.context_length
    if limit is None:
        return max_tokens
    longest = max(len(p) for p in prompts)
    room = limit - longest
    if room < 1:
        raise ApiError(400, f"the prompt is {longest} tokens; this model's context is {limit} tokens", param=param,
                       code="context_length_exceeded")
    if max_tokens > room:
        if defaulted:
            return room
        raise ApiError(400, f"the prompt ({longest} tokens) plus max_tokens ({max_tokens}) exceeds this model's "
                       f"context of {limit} tokens", param="max_tokens", code="context_length_exceeded")
    return max_tokens


async def _compile(runtime: Runtime, spec: ConstraintSpec | None, n_tools: int = 0):
    if spec is None:
        return None
    try:
        return await runtime.compiles.compile(spec)
    except ApiError as exc:
        if spec.param == "tools" and n_tools:
            exc.param = tool_param(exc.message, n_tools)
        raise


async def _plan_chat(req: ChatCompletionRequest, config: ServerConfig, runtime: Runtime) -> _Plan:
    if len(req.messages) > config.max_messages:
        raise ApiError(400, f"messages has {len(req.messages)} entries; the limit is {config.max_messages}",
                       param="messages", code="invalid_value")
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise ApiError(400, "max_tokens and max_completion_tokens disagree; send one of them",
                       param="max_completion_tokens", code="invalid_value")
    if req.logprobs:
        raise ApiError(400, "logprobs are not supported", param="logprobs", code="unsupported_parameter")
    if req.top_logprobs:
        raise ApiError(400, "top_logprobs is not supported", param="top_logprobs", code="unsupported_parameter")
    if req.modalities is not None and any(m != "text" for m in req.modalities):
        raise ApiError(400, "only the text modality is supported", param="modalities", code="unsupported_parameter")
    if req.tools is not None and len(req.tools) > config.max_tools:
        raise ApiError(400, f"tools has {len(req.tools)} entries; the limit is {config.max_tools}", param="tools",
                       code="invalid_value")
    if req.tools is not None and len({t.function.name for t in req.tools}) != len(req.tools):
        raise ApiError(400, "tools declares a function name twice", param="tools", code="invalid_value")
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    n, max_tokens, defaulted, stop, sampler, params = _check_common(req, config, runtime, asked,
                                                                     config.default_max_tokens)
    mode, name = tool_mode(req.tools, req.tool_choice)
    tools_spec = tool_spec(req.tools, mode, name) if mode in ("required", "named") else None
    if tools_spec is not None and req.tools:
        for i, t in enumerate(req.tools):
            if t.function.parameters is not None:
                check_bounds(schema_spec(t.function.parameters, f"tools[{i}].function.parameters"),
                             max_bytes=config.max_constraint_bytes, max_depth=config.max_schema_depth,
                             max_choices=config.max_choices)
    spec = _constraint(req, config, tools_spec)
    if stop and spec is not None and spec.kind == "json_schema":
        raise ApiError(400, "stop cannot be combined with a JSON schema or forced tool calls: the schema decides "
                       "where the output ends", param="stop", code="invalid_value")
    prompt = await asyncio.to_thread(runtime.encoder.encode_chat, req.messages,
                                     req.tools if mode != "none" else None)
    max_tokens = _fit_context([prompt], max_tokens, defaulted, runtime, "messages")
    grammar = await _compile(runtime, spec, len(req.tools or ()))
    gen = Generation([prompt], n, grammar, sampler, params, req.seed, max_tokens, stop, bool(req.ignore_eos))
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return _Plan("chat", gen, bool(req.stream), include_usage, mode, name)


async def _plan_completion(req: CompletionRequest, config: ServerConfig, runtime: Runtime) -> _Plan:
    if req.suffix is not None:
        raise ApiError(400, "suffix is not supported on /v1/completions; use POST /infill", param="suffix",
                       code="unsupported_parameter")
    if req.logprobs:
        raise ApiError(400, "logprobs are not supported", param="logprobs", code="unsupported_parameter")
    n, max_tokens, defaulted, stop, sampler, params = _check_common(req, config, runtime, req.max_tokens,
                                                                     config.default_completion_tokens)
    if req.best_of is not None and req.best_of != n:
        raise ApiError(400, "best_of is not supported (leave it out or set it equal to n)", param="best_of",
                       code="unsupported_parameter")
    prompt = req.prompt
    if isinstance(prompt, list) and not prompt:
        raise ApiError(400, "prompt is an empty list", param="prompt", code="invalid_value")
    if isinstance(prompt, str):
        texts: list[str] | None = [prompt]
    elif isinstance(prompt[0], str):
        texts = list(prompt)
    else:
        texts = None
    if texts is not None:
        if len(texts) > config.max_prompts:
            raise ApiError(400, f"prompt lists {len(texts)} prompts; the limit is {config.max_prompts}",
                           param="prompt", code="invalid_value")
        prompts = await asyncio.to_thread(lambda: [runtime.encoder.encode_text(t) for t in texts])
    else:
        batches = [prompt] if isinstance(prompt[0], int) else list(prompt)
        if len(batches) > config.max_prompts:
            raise ApiError(400, f"prompt lists {len(batches)} prompts; the limit is {config.max_prompts}",
                           param="prompt", code="invalid_value")
        prompts = [runtime.encoder.check_ids(list(b), f"prompt[{i}]" if len(batches) > 1 else "prompt")
                   for i, b in enumerate(batches)]
    if len(prompts) * n > config.max_n * config.max_prompts:  # pragma: no cover - bounded by the two above
        raise ApiError(400, "too many sequences in one request", param="n", code="invalid_value")
    spec = _constraint(req, config, None)
    if stop and spec is not None and spec.kind == "json_schema":
        raise ApiError(400, "stop cannot be combined with a JSON schema: the schema decides where the output ends",
                       param="stop", code="invalid_value")
    max_tokens = _fit_context(prompts, max_tokens, defaulted, runtime, "prompt")
    grammar = await _compile(runtime, spec)
    gen = Generation(prompts, n, grammar, sampler, params, req.seed, max_tokens, stop, bool(req.ignore_eos))
    echo = []
    if req.echo:
        echo = texts if texts is not None else [runtime.vocab.decode(p).decode("utf-8", "replace") for p in prompts]
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return _Plan("completion", gen, bool(req.stream), include_usage, echo=echo)


# --- running it ---------------------------------------------------------------------------------------


def _row_error(exc: BaseException | None) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ShuttingDown):
        return ApiError(503, "the server is shutting down", code="shutting_down")
    if isinstance(exc, LimitExceeded):
        return ApiError(422, f"the constraint is too complex to follow within this server's limits ({exc})",
                        code="constraint_too_complex")
    log.error("generation failed: %s", exc, exc_info=exc)
    return ApiError(500, f"generation failed: {type(exc).__name__}: {exc}", code="generation_failed")


def _finish_reason(result: dict[str, Any]) -> str:
    return "length" if result["finish"] == "length" else "stop"


def _usage(plan: _Plan, results: dict[int, dict[str, Any]]) -> dict[str, int]:
    prompt_tokens = sum(len(p) for p in plan.gen.prompts)
    completion = sum(r["completion_tokens"] for r in results.values())
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


class _Stream:
    """A ticket's events on the event loop: ``sink`` is called on the worker thread."""

    def __init__(self, runtime: Runtime, plan: _Plan):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.done = 0
        self.ticket: Ticket = runtime.submit(plan.gen, self._sink)

    def _sink(self, events) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, events)


async def _watch_disconnect(request: Request, stream: _Stream) -> None:
    while True:
        if await request.is_disconnected():
            stream.ticket.cancel()
            stream.queue.put_nowait(None)  # wakes the handler: nobody waits for the answer any more
            return
        await asyncio.sleep(0.25)


async def _respond(request: Request, runtime: Runtime, plan: _Plan):
    stream = _Stream(runtime, plan)
    created = int(time.time())
    prefix = "chatcmpl-" if plan.kind == "chat" else "cmpl-"
    rid = prefix + uuid.uuid4().hex
    if plan.stream:
        gen = _sse_chat(plan, stream, rid, created, runtime) if plan.kind == "chat" else \
            _sse_completion(plan, stream, rid, created, runtime)
        return StreamingResponse(gen, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    total = plan.gen.total
    texts: dict[int, list[str]] = {i: [] for i in range(total)}
    results: dict[int, dict[str, Any]] = {}
    watcher = asyncio.create_task(_watch_disconnect(request, stream))
    try:
        while len(results) < total:
            events = await stream.queue.get()
            if events is None:  # the client left
                return JSONResponse(error_body("the client closed the connection", code="client_closed"),
                                    status_code=499)
            for kind, index, payload in events:
                if kind == "delta":
                    texts[index].append(payload)
                else:
                    results[index] = payload
    finally:
        watcher.cancel()
        if len(results) < total:
            stream.ticket.cancel()
    failed = [r for r in results.values() if r["finish"] == "error"]
    if failed:
        raise _row_error(failed[0]["error"])
    choices = []
    for i in range(total):
        text = "".join(texts[i])
        if plan.kind == "chat":
            choices.append(_chat_choice(plan, i, text, results[i]))
        else:
            echo = plan.echo[i // plan.gen.n] if plan.echo else ""
            choices.append({"index": i, "text": echo + text, "logprobs": None,
                            "finish_reason": _finish_reason(results[i])})
    body = {"id": rid, "object": "chat.completion" if plan.kind == "chat" else "text_completion", "created": created,
            "model": runtime.model_name, "system_fingerprint": _fingerprint(runtime), "choices": choices,
            "usage": _usage(plan, results)}
    return JSONResponse(body)


def _fingerprint(runtime: Runtime) -> str:
    return "corral-" + runtime.vocab.fingerprint[:12]


def _chat_choice(plan: _Plan, index: int, text: str, result: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    finish = _finish_reason(result)
    if plan.tool_mode in ("required", "named") and result["finish"] != "length":
        calls = parse_tool_calls(text, plan.tool_mode, plan.tool_name)
        if calls is not None:
            message["content"] = None
            message["tool_calls"] = calls
            finish = "tool_calls" if plan.tool_mode == "required" else "stop"
    return {"index": index, "message": message, "logprobs": None, "finish_reason": finish}


def _sse(obj: Any) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


async def _events(stream: _Stream, total: int) -> AsyncIterator[tuple[str, int, Any]]:
    while stream.done < total:
        for event in await stream.queue.get():
            if event[0] == "done":
                stream.done += 1
            yield event


@contextlib.contextmanager
def _cancel_unless_done(stream: _Stream, total: int):
    """Cancel the ticket when the response ends early: the client left, or a choice failed."""
    try:
        yield
    finally:
        if stream.done < total:
            stream.ticket.cancel()


async def _sse_chat(plan: _Plan, stream: _Stream, rid: str, created: int, runtime: Runtime) -> AsyncIterator[str]:
    model = runtime.model_name
    fp = _fingerprint(runtime)

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
        return _sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "system_fingerprint": fp,
                     "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    total = plan.gen.total
    with _cancel_unless_done(stream, total):
        call_ids = {i: f"call_{uuid.uuid4().hex[:24]}" for i in range(total)}
        buffers: dict[int, list[str]] = {i: [] for i in range(total)}
        results: dict[int, dict[str, Any]] = {}
        for i in range(total):
            if plan.tool_mode == "named":
                yield chunk(i, {"role": "assistant", "content": None, "tool_calls": [
                    {"index": 0, "id": call_ids[i], "type": "function",
                     "function": {"name": plan.tool_name, "arguments": ""}}]})
            else:
                yield chunk(i, {"role": "assistant", "content": ""})
        async for kind, index, payload in _events(stream, total):
            if kind == "delta":
                if plan.tool_mode == "named":
                    yield chunk(index, {"tool_calls": [{"index": 0, "function": {"arguments": payload}}]})
                elif plan.tool_mode == "required":
                    buffers[index].append(payload)
                else:
                    yield chunk(index, {"content": payload})
                continue
            results[index] = payload
            if payload["finish"] == "error":
                yield _sse(_row_error(payload["error"]).body())
                yield "data: [DONE]\n\n"
                return
            finish = _finish_reason(payload)
            if plan.tool_mode == "required":
                text = "".join(buffers[index])
                calls = parse_tool_calls(text, "required", None) if payload["finish"] != "length" else None
                if calls is None:
                    yield chunk(index, {"content": text})
                else:
                    yield chunk(index, {"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]})
                    finish = "tool_calls"
            yield chunk(index, {}, finish)
        if plan.include_usage:
            yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                        "system_fingerprint": fp, "choices": [], "usage": _usage(plan, results)})
        yield "data: [DONE]\n\n"


async def _sse_completion(plan: _Plan, stream: _Stream, rid: str, created: int,
                          runtime: Runtime) -> AsyncIterator[str]:
    model = runtime.model_name

    def chunk(index: int, text: str, finish: str | None = None) -> str:
        return _sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                     "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}]})

    total = plan.gen.total
    with _cancel_unless_done(stream, total):
        results: dict[int, dict[str, Any]] = {}
        if plan.echo:
            for i in range(total):
                yield chunk(i, plan.echo[i // plan.gen.n])
        async for kind, index, payload in _events(stream, total):
            if kind == "delta":
                yield chunk(index, payload)
                continue
            results[index] = payload
            if payload["finish"] == "error":
                yield _sse(_row_error(payload["error"]).body())
                yield "data: [DONE]\n\n"
                return
            yield chunk(index, "", _finish_reason(payload))
        if plan.include_usage:
            yield _sse({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
                        "usage": _usage(plan, results)})
        yield "data: [DONE]\n\n"


# --- infilling ----------------------------------------------------------------------------------------

#: grammars ``/infill`` takes by name (``grammars.builtin``)
NAMED_GRAMMARS = ("cpp", "json")


def _infill_parts(req: InfillRequest, config: ServerConfig) -> tuple[list[str], str]:
    """The fixed texts (a hole between each two) and the context the model sees before them.

    ``segments`` are the texts themselves. llama.cpp's fields make one hole: the prefix with
    ``prompt`` appended (the start of the middle already written) before it, the suffix after;
    ``input_extra`` chunks (other files) become unconstrained context before the first text.
    """
    llama_fields = [f for f in ("input_prefix", "input_suffix", "prompt") if getattr(req, f) is not None]
    context = "".join((f"// {c.filename}\n" if c.filename else "") + c.text + "\n" for c in (req.input_extra or ()))
    if req.segments is not None:
        if llama_fields:
            raise ApiError(400, f"send segments or llama.cpp's fields, not both (got {', '.join(llama_fields)})",
                           param="segments", code="invalid_value")
        if len(req.segments) < 2:
            raise ApiError(400, "segments needs at least two texts (a hole goes between each two)",
                           param="segments", code="invalid_value")
        if len(req.segments) > config.max_prompts + 1:
            raise ApiError(400, f"segments has more than {config.max_prompts + 1} texts", param="segments",
                           code="invalid_value")
        return list(req.segments), context
    if not llama_fields:
        raise ApiError(400, "send input_prefix and input_suffix (llama.cpp) or segments", param="input_prefix",
                       code="missing_required_parameter")
    return [(req.input_prefix or "") + (req.prompt or ""), req.input_suffix or ""], context


async def _infill(req: InfillRequest, config: ServerConfig, runtime: Runtime):
    if req.model is not None and req.model != runtime.model_name:
        raise ApiError(404, f"The model '{req.model}' does not exist", param="model", code="model_not_found")
    parts, context = _infill_parts(req, config)
    if req.grammar is not None and req.json_schema is not None:
        raise ApiError(400, "send grammar or json_schema, not both", param="json_schema", code="invalid_value")
    per_hole = req.max_tokens_per_hole or req.n_predict or config.default_max_tokens
    if per_hole > config.max_tokens_limit:
        raise ApiError(400, f"max_tokens_per_hole is {per_hole}; the limit is {config.max_tokens_limit}",
                       param="max_tokens_per_hole", code="invalid_value")
    spec: ConstraintSpec | None = None
    if req.json_schema is not None:
        spec = schema_spec(req.json_schema, "json_schema")
    elif req.grammar is not None and req.grammar not in NAMED_GRAMMARS:
        spec = ConstraintSpec(detect_grammar_syntax(req.grammar, "grammar"), req.grammar, (), "grammar")
    if spec is not None:
        check_bounds(spec, max_bytes=config.max_constraint_bytes, max_depth=config.max_schema_depth,
                     max_choices=config.max_choices)
    infill = getattr(engine, "infill", None)
    if infill is None:
        raise ApiError(501, "infilling is not available in this build: the engine has no infill()",
                       code="not_implemented")
    grammar: Any = req.grammar if spec is None else await _compile(runtime, spec)
    if req.steps is not None and not runtime.diffusion:
        raise ApiError(400, "steps applies to masked-diffusion models; this model writes the holes token by token",
                       param="steps", code="invalid_value")
    if req.steps is not None and req.steps > config.max_tokens_limit:
        raise ApiError(400, f"steps is {req.steps}; the limit is {config.max_tokens_limit}", param="steps",
                       code="invalid_value")
    # a diffusion model fills every hole in one canvas in its own forward passes; a causal model's
    # steps join the scheduler's batch
    model = runtime.lm if runtime.diffusion else ScheduledLM(runtime.scheduler)
    kwargs: dict[str, Any] = {
        "model": model, "tokenizer": runtime.vocab, "compiler": runtime.compiler, "steps": req.steps,
        "grammar": grammar, "max_tokens_per_hole": per_hole, "seed": req.seed, "prompt": context,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p, "fim": runtime.fim_tokens(),
        "constrained": grammar is not None,
    }
    try:
        accepted = inspect.signature(infill).parameters
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    except (TypeError, ValueError):  # pragma: no cover - a callable without a signature: pass everything
        pass
    try:
        result = await asyncio.to_thread(infill, parts, **kwargs)
    except Exception as exc:  # noqa: BLE001 - typed engine errors become 4xx like everywhere else
        from server.constraints import error_for

        if isinstance(exc, (GrammarError, LimitExceeded)) or type(exc).__name__ == "UncompletableError":
            param = "json_schema" if req.json_schema is not None else "grammar" if req.grammar else "segments"
            error = error_for(exc, param)
            if type(exc).__name__ == "UncompletableError":
                error = ApiError(400, f"no fill of the holes makes the text valid under the {param}", param=param,
                                 code="uncompletable")
            raise error from None
        if isinstance(exc, (ValueError, TypeError)):
            raise ApiError(400, f"infill: {exc}", code="invalid_value") from None
        raise _row_error(exc) from None
    return JSONResponse(_infill_body(result, runtime))


def _infill_body(result: Any, runtime: Runtime) -> dict[str, Any]:
    """llama.cpp's answer (``content``: the fill of the one hole, or all fills joined) plus
    ``fills`` (one per hole), the whole ``text`` and per-hole reports."""
    fills = [str(f) for f in getattr(result, "fills", [])]
    holes = [{"fill": h.fill, "tokens": h.tokens, "end": h.end, "closed_by_witness": h.closed_by_witness}
             for h in getattr(result, "holes", [])]
    return {"content": "".join(fills), "fills": fills, "text": getattr(result, "text", ""), "holes": holes,
            "model": runtime.model_name, "tokens_predicted": sum(h["tokens"] for h in holes)}
