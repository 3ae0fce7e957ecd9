"""The wire format: OpenAI request bodies as pydantic models, and the OpenAI error object.

Requests are validated strictly (``extra="forbid"``, no type coercion): a misspelt field such as
``respose_format`` or ``json_schema.shema`` would otherwise silently turn a constrained request
into an unconstrained one, so it is a 400 naming the field, as OpenAI answers
"Unrecognized request argument". Fields OpenAI defines that corral does not implement are
accepted when they ask for nothing (``logprobs: false``, ``frequency_penalty: 0``) and refused
with a 400 naming them otherwise; fields with no effect on the output (``user``, ``metadata``,
``store``, ``service_tier``) are accepted and ignored. Messages and content parts ignore unknown
fields (clients echo back assistant messages with extra members).

Every error is ``ApiError``, rendered as ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "ApiError",
    "error_body",
    "validation_error",
    "parse_json",
    "ChatCompletionRequest",
    "CompletionRequest",
    "InfillRequest",
    "StructuredOutputs",
    "ResponseFormat",
    "Tool",
]


class ApiError(Exception):
    """An error answered to the client: HTTP ``status`` and the OpenAI error object's fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _error_type(self.status)

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def _error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status == 501:
        return "not_implemented_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _param(loc: tuple) -> str | None:
    """A pydantic location as a parameter path: ``messages[0].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not isinstance(part, str) or part.startswith(("function-", "union[", "literal[")):
            continue  # pydantic's names for union members, not part of the request
        elif part in ("str", "list[str]", "list[int]", "list[list[int]]", "dict[str,any]", "bool", "int", "float",
                      "list[ContentPart]", "NamedToolChoice", "str-enum"):
            continue
        else:
            out += ("." if out else "") + part
    return out or None


def validation_error(exc: ValidationError) -> ApiError:
    """The first problem pydantic found, as a 400 naming the parameter."""
    errors = exc.errors(include_url=False)
    first = min(errors, key=lambda e: (e["type"] != "extra_forbidden", len(e["loc"]))) if errors else None
    if first is None:
        return ApiError(400, "invalid request", code="invalid_request")
    param = _param(tuple(first["loc"]))
    kind = first["type"]
    if kind == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {param}", param=param,
                        code="unknown_parameter")
    if kind == "missing":
        return ApiError(400, f"Missing required parameter: {param}", param=param, code="missing_required_parameter")
    value = first.get("input")
    shown = json.dumps(value, default=repr)[:80] if not isinstance(value, dict) else "an object"
    return ApiError(400, f"Invalid value for {param}: {first['msg']} (got {shown})", param=param,
                    code="invalid_value" if "type" not in kind else "invalid_type")


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object; 400 with line and column when it does not parse."""
    if not body.strip():
        raise ApiError(400, "The request body is empty; send a JSON object", code="invalid_json")
    try:
        data = json.loads(body)
    except UnicodeDecodeError:
        raise ApiError(400, "The request body is not UTF-8 text", code="invalid_json") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                       code="invalid_json") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise ApiError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "The request body is nested too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"The request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    return data


# --- request models --------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class JsonSchemaSpec(_Strict):
    """``response_format.json_schema``: ``strict`` false relaxes keywords corral cannot enforce."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's ``response_format``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs`` extra field: exactly one of ``json``, ``regex``, ``grammar``,
    ``choice`` or ``json_object``; ``whitespace`` (a corral extension) for ``json``."""

    json_: dict[str, Any] | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None
    whitespace: Literal["compact", "flexible"] | None = None


class ContentPart(_Loose):
    """One part of a message's content; only ``text`` parts are supported."""

    type: str
    text: str | None = None


class ToolCallFunction(_Loose):
    name: str
    arguments: str


class ToolCall(_Loose):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(_Loose):
    """A chat message."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    """A tool the model may call (functions only)."""

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Loose):
    include_usage: bool | None = None


Stop = str | list[str] | None


class _Sampling(_Strict):
    """Fields shared by the chat and completions endpoints."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    # --- extras (vLLM's and corral's) ---
    structured_outputs: StructuredOutputs | None = None
    sampler: str | None = None
    top_k: int | None = Field(default=None, ge=0)
    ignore_eos: bool | None = None


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    modalities: list[str] | None = None
    reasoning_effort: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    verbosity: str | None = None


class CompletionRequest(_Sampling):
    """``POST /v1/completions`` (the legacy endpoint)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class ExtraContext(_Loose):
    """llama.cpp's ``input_extra`` chunk: context from another file."""

    filename: str | None = None
    text: str


class InfillRequest(_Strict):
    """``POST /infill``: llama.cpp's fields, or ``segments`` (fixed texts with a hole between each
    two), under an optional ``grammar`` (``"cpp"``, ``"json"``, GBNF or Lark text) or
    ``json_schema``."""

    model: str | None = None
    input_prefix: str | None = None
    input_suffix: str | None = None
    input_extra: list[ExtraContext] | None = None
    prompt: str | None = None
    segments: list[str] | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | bool | None = None
    max_tokens_per_hole: int | None = Field(default=None, ge=1)
    n_predict: int | None = Field(default=None, ge=1)
    seed: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    #: model calls for a masked-diffusion model's canvas (default: one per masked position)
    steps: int | None = Field(default=None, ge=1)


def validate(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """``model.model_validate(data)``, a 400 naming the field on failure."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    except RecursionError:
        raise ApiError(400, "The request is nested too deeply", code="invalid_request") from None
