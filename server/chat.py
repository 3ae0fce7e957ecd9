"""Prompts and tool calls: chat messages to token ids, forced tool calls to a JSON Schema and back.

**Chat prompts.** When the tokenizer has a chat template, ``apply_chat_template(messages,
tools=..., add_generation_prompt=True)`` renders the conversation (tools go to the template when
it takes them). Without one, the plain fallback format is::

    System: You are terse.
    User: Name a colour.
    Assistant: Red.
    Tool [call_1]: {"temperature": 21}
    User: And another?
    Assistant:

one ``Role: content`` line per message (``developer`` counts as ``System``; an assistant's tool
calls are written as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``), a ``Tools:``
line listing the functions' JSON definitions first when tools are given, and ``Assistant:``
(with no trailing space) last. BOS is prepended when the tokenizer adds one to plain text.

**Tool calls.** ``tool_choice`` ``"required"`` constrains the output to a JSON array of one or
more calls ``[{"name": ..., "parameters": {...}}]``, each call's ``parameters`` checked by that
function's ``parameters`` schema (vLLM's format); a named function constrains the output to that
function's arguments object. ``"none"`` ignores the tools; ``"auto"`` (the default when tools
are given) leaves the output unconstrained and returns it as text: deciding *whether* to call a
tool needs a model-specific tool parser, which corral does not ship.

Each function's ``parameters`` schema is embedded as its own resource (``$id``
``urn:corral:tool:<i>``), so its local ``$ref``s (``#/$defs/...``) resolve inside it.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from grammars import TokenVocabulary
from server.constraints import ConstraintSpec, schema_spec
from server.protocol import ApiError, Message, NamedToolChoice, Tool

__all__ = ["PromptEncoder", "tool_mode", "tool_spec", "parse_tool_calls", "EMPTY_PARAMETERS"]

#: OpenAI: "Omitting parameters defines a function with an empty parameter list."
EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}

_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}


def _text_of(message: Message, where: str) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise ApiError(400, f"content parts of type {part.type!r} are not supported; send text parts",
                           param=f"{where}.content[{i}].type", code="unsupported_content")
        parts.append(part.text)
    return "".join(parts)


class PromptEncoder:
    """Turns prompts (text, token ids, chat messages) into token ids for one vocabulary."""

    def __init__(self, vocab: TokenVocabulary):
        self.vocab = vocab
        self.tokenizer = vocab.hf_tokenizer
        self.template = getattr(self.tokenizer, "chat_template", None) if self.tokenizer is not None else None
        self.adds_bos = self._adds_bos()

    def _adds_bos(self) -> bool:
        bos = self.vocab.bos_token_id
        if self.tokenizer is None or bos is None or bos in self.vocab.eos_token_ids:
            return False
        try:
            ids = self.tokenizer.encode("a", add_special_tokens=True)
        except Exception:  # noqa: BLE001 - exotic tokenizers: no BOS
            return False
        return bool(ids) and ids[0] == bos

    def encode_text(self, text: str) -> list[int]:
        """A plain prompt: the tokenizer's ids, BOS first when the tokenizer adds one; never empty."""
        ids = self.vocab.encode(text) if text else []
        bos = self.vocab.bos_token_id
        if self.adds_bos:
            ids = [bos] + ids
        if not ids:
            ids = [bos if bos is not None else min(self.vocab.eos_token_ids)]
        return ids

    def check_ids(self, ids: list[int], param: str) -> list[int]:
        """Token-id prompts: non-empty, every id a token of the vocabulary (400 otherwise)."""
        if not ids:
            raise ApiError(400, f"{param} is an empty list of token ids", param=param, code="invalid_value")
        bad = [t for t in ids if not 0 <= t < self.vocab.size]
        if bad:
            raise ApiError(400, f"{param} holds token ids outside [0, {self.vocab.size}): {bad[:5]}", param=param,
                           code="invalid_value")
        return ids

    def encode_chat(self, messages: list[Message], tools: list[Tool] | None) -> list[int]:
        """The conversation rendered for the model, ending where the assistant speaks next."""
        texts = [_text_of(m, f"messages[{i}]") for i, m in enumerate(messages)]
        if self.template:
            return self._templated(messages, texts, tools)
        return self.encode_text(self._plain(messages, texts, tools))

    def _templated(self, messages: list[Message], texts: list[str], tools: list[Tool] | None) -> list[int]:
        convo = []
        for m, text in zip(messages, texts):
            item: dict[str, Any] = {"role": m.role, "content": text}
            if m.name:
                item["name"] = m.name
            if m.tool_calls:
                item["tool_calls"] = [{"id": c.id, "type": "function",
                                       "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                      for c in m.tool_calls]
            if m.tool_call_id:
                item["tool_call_id"] = m.tool_call_id
            convo.append(item)
        extra = {"tools": [t.model_dump(by_alias=True, exclude_none=True) for t in tools]} if tools else {}
        try:
            text = self.tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=False, **extra)
        except Exception as exc:  # noqa: BLE001 - templates raise whatever jinja raises for bad conversations
            raise ApiError(400, f"the model's chat template refused these messages: {exc}", param="messages",
                           code="invalid_messages") from None
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return ids or self.encode_text("")

    @staticmethod
    def _plain(messages: list[Message], texts: list[str], tools: list[Tool] | None) -> str:
        lines = []
        if tools:
            defs = [t.function.model_dump(exclude_none=True) for t in tools]
            lines.append("Tools: " + json.dumps(defs, ensure_ascii=False))
        for m, text in zip(messages, texts):
            role = _ROLES[m.role]
            if m.role == "tool" and m.tool_call_id:
                role = f"Tool [{m.tool_call_id}]"
            calls = "".join(
                "<tool_call>" + json.dumps({"name": c.function.name, "arguments": c.function.arguments},
                                           ensure_ascii=False) + "</tool_call>"
                for c in (m.tool_calls or ())
            )
            lines.append(f"{role}: {text}{calls}")
        lines.append("Assistant:")
        return "\n".join(lines)


# --- tools ------------------------------------------------------------------------------------------


def tool_mode(tools: list[Tool] | None, tool_choice: Any) -> tuple[str, str | None]:
    """``("none" | "auto" | "required" | "named", function name)`` for a request; 400 when the
    choice names a function that is not among ``tools`` or asks for tools without any."""
    if tool_choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(tool_choice, NamedToolChoice):
        name = tool_choice.function.name
        if not tools or name not in {t.function.name for t in tools}:
            raise ApiError(400, f"tool_choice names function {name!r}, which is not in tools",
                           param="tool_choice.function.name", code="invalid_value")
        return "named", name
    if tool_choice == "required" and not tools:
        raise ApiError(400, "tool_choice 'required' needs at least one tool", param="tool_choice",
                       code="invalid_value")
    return tool_choice, None


def _embedded(parameters: Any, i: int) -> Any:
    if parameters is None:
        parameters = EMPTY_PARAMETERS
    if isinstance(parameters, dict):
        return {**parameters, "$id": f"urn:corral:tool:{i}"} if "$id" not in parameters else parameters
    return parameters


def tool_spec(tools: list[Tool], mode: str, name: str | None) -> ConstraintSpec:
    """The constraint of a forced tool call (``mode`` ``"required"`` or ``"named"``)."""
    if mode == "named":
        index = next(i for i, t in enumerate(tools) if t.function.name == name)
        params = tools[index].function.parameters
        return schema_spec(params if params is not None else EMPTY_PARAMETERS, f"tools[{index}].function.parameters")
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.function.name}, "parameters": _embedded(t.function.parameters, i)},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for i, t in enumerate(tools)
    ]
    schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    return schema_spec(schema, "tools")


_TOOL_POINTER = re.compile(r"#/items(?:/anyOf/(\d+))?/properties/parameters")


def tool_param(message: str, n_tools: int) -> str:
    """Point an error in the combined ``required`` schema at the tool it came from."""
    m = _TOOL_POINTER.search(message)
    if m is None:
        return "tools"
    index = int(m.group(1)) if m.group(1) is not None else 0
    return f"tools[{index}].function.parameters" if index < n_tools else "tools"


def parse_tool_calls(text: str, mode: str, name: str | None) -> list[dict[str, Any]] | None:
    """OpenAI ``tool_calls`` from a finished forced-call output; None when it does not parse
    (a truncated output: the caller returns it as content with ``finish_reason="length"``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if mode == "named":
        calls = [(name, value)]
    else:
        if not isinstance(value, list):
            return None
        calls = [(c.get("name"), c.get("parameters")) for c in value if isinstance(c, dict)]
    return [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": fn, "arguments": json.dumps(args, ensure_ascii=False, separators=(",", ":"))
                      if mode != "named" else text}}
        for fn, args in calls
    ]
