"""Anthropic Messages requests: their shapes, and their translation into a chat request.

A ``POST /v1/messages`` body is validated here, strictly in the types of the fields
draftpen knows and leniently about fields it does not (Anthropic adds fields often and
Claude Code sends many: ``metadata``, ``context_management``, ``service_tier``...; they
are ignored), then rewritten as the engine's one internal request, a validated
:class:`~app.engine.dialects.openai_chat_schema.ChatCompletionRequest`:

- ``system`` (a string or text blocks) becomes the first, system, message;
- ``text`` blocks become message content; an assistant's ``tool_use`` blocks become its
  ``tool_calls``; a user's ``tool_result`` blocks become ``tool`` messages (an error
  result's text starts with "Error: ", since chat templates have no error flag);
  ``thinking`` blocks of earlier turns are not shown to the model (as
  ``reasoning_content`` is not);
- ``image``, ``document`` and other blocks a text model cannot read get a 400 naming
  the block;
- ``tools`` keep their ``input_schema`` as the function's parameters; tools of
  Anthropic's own server-side types (``web_search_...``, ``code_execution_...``) are
  left out unless ``tool_choice`` names one; ``tool_choice`` ``any`` is ``required``
  and ``tool`` names the function, so both are grammar-certain;
- ``thinking`` ``enabled``/``adaptive``/``disabled`` turns the template's thinking switch;
- ``output_config.format`` (structured outputs) is the chat request's JSON-schema
  ``response_format``, followed exactly;
- ``stop_sequences``, ``temperature``, ``top_p``, ``top_k`` and ``max_tokens`` go
  through as they are; ``cache_control`` is accepted anywhere and ignored (the engine
  keeps conversations' prefixes anyway).

Errors the chat request's own checks find name the Anthropic field they came from.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.engine.dialects.openai_chat_schema import ChatCompletionRequest
from app.engine.schema import MAX_STOP_STRINGS, ApiError, parse_request

# Anthropic's rule for tool names.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
# Block types a text model cannot read; named in the 400 they get.
_UNREADABLE_BLOCKS = {
    "image": "images",
    "document": "documents",
    "search_result": "search results",
    "container_upload": "files",
}


class _Lenient(BaseModel):
    """Known fields typed strictly; unknown ones (Anthropic adds them often) ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class TextBlock(_Lenient):
    """A ``text`` block (``cache_control`` and ``citations`` ignored)."""

    type: Literal["text"]
    text: str


class ToolUseBlock(_Lenient):
    """A tool call an earlier assistant turn made."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Lenient):
    """The answer to one ``tool_use``: a string, or text blocks."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Lenient):
    """An earlier turn's reasoning, sent back as the API returned it; not shown again."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Lenient):
    """Reasoning Anthropic's API encrypted; nothing a local model can read."""

    type: Literal["redacted_thinking"]
    data: str


_BLOCKS: dict[str, type[_Lenient]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
}
# Which role may send which block.
_ROLE_BLOCKS = {
    "system": {"text"},
    "user": {"text", "tool_result"},
    "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
}


class MessageIn(_Lenient):
    """One turn: ``content`` a string or a list of blocks (read by :func:`chat_request`).

    ``system`` turns among the messages (Claude Code sends them, with the
    ``mid-conversation-system`` beta) are system messages where they stand.
    """

    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class ToolIn(_Lenient):
    """A tool: a function with an ``input_schema``, or one of Anthropic's server tools."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    # Follow input_schema exactly (its keywords all enforced) rather than as a guide.
    strict: bool | None = None
    # Absent or "custom": a function of the client's. Anything else ("web_search_20250305",
    # "bash_20250124", ...) is a tool Anthropic defines and runs; a local model has none.
    type: str | None = None

    @property
    def is_function(self) -> bool:
        """Whether this is the client's own function (the only kind a local model calls)."""
        return self.type in (None, "custom")

    @model_validator(mode="after")
    def _function_has_schema(self) -> ToolIn:
        if self.is_function and self.input_schema is None:
            raise ValueError(f"tool {self.name!r} needs an input_schema (a JSON Schema object)")
        return self


class ToolChoiceIn(_Lenient):
    """``auto``, ``any`` (some tool), ``tool`` (the one named) or ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoiceIn:
        if self.type == "tool" and self.name is None:
            raise ValueError('tool_choice of type "tool" needs the "name" of the tool')
        return self


class ThinkingIn(_Lenient):
    """Extended thinking: on (``budget_tokens`` is accepted, not enforced) or off."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class OutputFormatIn(_Lenient):
    """Structured outputs: the reply is JSON matching ``schema``, grammar-certain."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfigIn(_Lenient):
    """``output_config``: its ``format`` is followed; ``effort`` changes nothing here."""

    format: OutputFormatIn | None = None


class CountTokensRequest(_Lenient):
    """``POST /v1/messages/count_tokens``: what the prompt is made of."""

    model: str
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    output_config: OutputConfigIn | None = None
    # Changes nothing for a local model; typed so a wrong one is still a 400.
    metadata: dict[str, Any] | None = None


RequestT = TypeVar("RequestT", bound=CountTokensRequest)


def parse_messages_request(model: type[RequestT], data: object) -> RequestT:
    """``data`` validated as ``model``; a 400 naming the field when it is not."""
    if not isinstance(data, dict):
        raise ApiError(400, f"The request body must be a JSON object, not {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise _invalid_field(error) from None


def chat_request(request: CountTokensRequest) -> ChatCompletionRequest:
    """The engine's chat request for a Messages (or count_tokens) request."""
    messages, origins = _chat_messages(request)
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    tools, tool_origins = _chat_tools(request)
    if tools:
        body["tools"] = tools
    choice = request.tool_choice
    if choice is not None:
        body["tool_choice"] = _chat_tool_choice(choice)
        if choice.disable_parallel_tool_use and tools:
            body["parallel_tool_calls"] = False
    if request.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": request.thinking.type != "disabled"}
    if isinstance(request, MessagesRequest):
        body["max_tokens"] = request.max_tokens
        body["stream"] = request.stream
        if request.stop_sequences:
            body["stop"] = request.stop_sequences
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(request, name)
            if value is not None:
                body[name] = value
        output = request.output_config.format if request.output_config else None
        if output is not None:
            schema = {"name": "output", "schema": output.schema_, "strict": True}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        if request.top_p == 0:
            # Anthropic allows 0; the loop's top_p must be above it: keep the top token.
            body["top_p"] = 1e-9
    try:
        return parse_request(ChatCompletionRequest, body)
    except ApiError as error:
        raise _renamed(error, origins, tool_origins) from None


def _chat_messages(request: CountTokensRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages, and for each where it came from in the Messages request."""
    messages: list[dict[str, Any]] = []
    origins: list[str] = []
    system = request.system
    if system:
        text = system if isinstance(system, str) else "\n".join(block.text for block in system)
        messages.append({"role": "system", "content": text})
        origins.append("system")
    for index, message in enumerate(request.messages):
        where = f"messages[{index}]"
        if isinstance(message.content, str):
            messages.append({"role": message.role, "content": message.content})
            origins.append(where)
            continue
        blocks = [
            _block(raw, message.role, f"{where}.content[{number}]")
            for number, raw in enumerate(message.content)
        ]
        if message.role == "assistant":
            messages.append(_assistant_message(blocks))
            origins.append(where)
            continue
        if message.role == "system":
            text = "\n".join(block.text for block in blocks if isinstance(block, TextBlock))
            messages.append({"role": "system", "content": text})
            origins.append(where)
            continue
        texts: list[str] = []
        for number, block in enumerate(blocks):
            if isinstance(block, ToolResultBlock):
                if texts:
                    messages.append({"role": "user", "content": "\n".join(texts)})
                    origins.append(where)
                    texts = []
                content = _tool_result_text(block, f"{where}.content[{number}]")
                messages.append(
                    {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}
                )
                origins.append(f"{where}.content[{number}]")
            elif isinstance(block, TextBlock):
                texts.append(block.text)
        if texts or not blocks:
            messages.append({"role": "user", "content": "\n".join(texts)})
            origins.append(where)
    return messages, origins


def _block(raw: dict[str, Any], role: str, where: str) -> _Lenient:
    """One content block, validated; a 400 naming it when it cannot be read."""
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise _invalid(where, 'a content block needs a "type" (text, tool_use, tool_result...)')
    if kind in _UNREADABLE_BLOCKS:
        raise _invalid(
            where,
            f"{kind} blocks are not supported: draftpen serves text models, which cannot "
            f"read {_UNREADABLE_BLOCKS[kind]}. Send the content as text instead",
        )
    if kind not in _ROLE_BLOCKS[role]:
        allowed = ", ".join(sorted(_ROLE_BLOCKS[role]))
        raise _invalid(where, f"a {role} message cannot hold {kind!r} blocks here ({allowed})")
    try:
        return _BLOCKS[kind].model_validate(raw)
    except ValidationError as error:
        raise _invalid_field(error, where) from None


def _assistant_message(blocks: list[_Lenient]) -> dict[str, Any]:
    """An assistant turn: its text, and its tool_use blocks as tool_calls."""
    text = "".join(block.text for block in blocks if isinstance(block, TextBlock))
    calls = [
        {
            "id": block.id,
            "type": "function",
            "function": {"name": block.name, "arguments": json.dumps(block.input)},
        }
        for block in blocks
        if isinstance(block, ToolUseBlock)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_result_text(block: ToolResultBlock, where: str) -> str:
    """A tool result's text: its string, or its text blocks joined."""
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        parts = []
        for number, raw in enumerate(content):
            inner = f"{where}.content[{number}]"
            if raw.get("type") != "text":
                kind = raw.get("type")
                readable = _UNREADABLE_BLOCKS.get(kind, f"{kind!r} blocks")  # type: ignore[arg-type]
                raise _invalid(
                    inner,
                    f"a tool result here may hold text blocks only: draftpen serves text "
                    f"models, which cannot read {readable}",
                )
            try:
                parts.append(TextBlock.model_validate(raw).text)
            except ValidationError as error:
                raise _invalid_field(error, inner) from None
        text = "\n".join(parts)
    return f"Error: {text}" if block.is_error else text


def _chat_tools(request: CountTokensRequest) -> tuple[list[dict[str, Any]], list[int]]:
    """The client's functions as chat tools, and each one's index in ``tools``."""
    named = request.tool_choice.name if request.tool_choice is not None else None
    tools: list[dict[str, Any]] = []
    origins: list[int] = []
    for index, tool in enumerate(request.tools or ()):
        if not tool.is_function:
            if tool.name == named:
                raise _invalid(
                    "tool_choice",
                    f"names {tool.name!r}, a server tool of type {tool.type!r} that Anthropic "
                    "runs; a local model can call only the client's own tools",
                )
            continue  # a server tool the model cannot call: left out, as llama.cpp does
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.strict is not None:
            function["strict"] = tool.strict
        tools.append({"type": "function", "function": function})
        origins.append(index)
    return tools, origins


def _chat_tool_choice(choice: ToolChoiceIn) -> str | dict[str, Any]:
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


# The chat request's names for fields that the Messages request names otherwise.
_TOOL_FIELDS = {".function.parameters": ".input_schema", ".function.name": ".name"}
_CHAT_FIELD = re.compile(r"\b(messages|tools)\[(\d+)\]((?:\.function)?\.\w+)?")
_CHAT_WORDS = {
    "response_format.json_schema.schema": "output_config.format.schema",
    "tool_call_id": "tool_use_id",
    "tool_calls": "tool_use blocks",
    "'stop'": "'stop_sequences'",
}


def _renamed(error: ApiError, origins: list[str], tool_origins: list[int]) -> ApiError:
    """``error`` with the chat request's field names put back as the Messages request's."""

    def name(match: re.Match[str]) -> str:
        kind, index, rest = match.group(1), int(match.group(2)), match.group(3) or ""
        if kind == "messages":
            return (origins[index] if index < len(origins) else match.group(0)) + rest
        tool = tool_origins[index] if index < len(tool_origins) else index
        return f"tools[{tool}]" + _TOOL_FIELDS.get(rest, rest)

    def rename(text: str) -> str:
        text = _CHAT_FIELD.sub(name, text)
        for chat_word, word in _CHAT_WORDS.items():
            text = text.replace(chat_word, word)
        return text

    param = error.param
    if param is not None:
        param = "stop_sequences" if param == "stop" else rename(param)
    return ApiError(
        error.status,
        rename(error.message),
        error_type=error.error_type,
        param=param,
        code=error.code,
        headers=error.headers,
    )


def _invalid(where: str, message: str) -> ApiError:
    return ApiError(400, f"Invalid {where}: {message}.", param=where, code="invalid_value")


def _invalid_field(error: ValidationError, prefix: str = "") -> ApiError:
    """The first problem pydantic found, named as a field path (``messages[0].role``)."""
    first = error.errors(include_url=False)[0]
    path = prefix
    for part in first["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in {"str", "int", "float", "bool", "list", "dict", "none"} or "[" in part:
            continue  # pydantic's names for the members of a union, not fields
        else:
            path += f".{part}" if path else part
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "missing":
        return ApiError(
            400,
            f"Missing required field '{path}'.",
            param=path,
            code="missing_required_parameter",
        )
    shown = first.get("input")
    got = f" (got {shown!r})" if isinstance(shown, str | int | float | bool) else ""
    where = f"'{path}'" if path else "the request"
    return ApiError(400, f"Invalid {where}: {message}{got}.", param=path or None)
