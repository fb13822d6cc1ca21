"""Anthropic Messages requests translated into the engine's one chat request.

A validated Messages (or count_tokens) request (:mod:`.anthropic_schema`) becomes a
:class:`~app.engine.dialects.openai_chat_schema.ChatCompletionRequest`: the system
prompt, the messages and their blocks, the tools and the tool choice, the thinking
switch and the limits; errors the chat request's own checks find are renamed to the
Anthropic field they came from.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from app.engine.dialects.anthropic_schema import (
    BLOCKS,
    ROLE_BLOCKS,
    UNREADABLE_BLOCKS,
    CountTokensRequest,
    Lenient,
    MessagesRequest,
    TextBlock,
    ToolChoiceIn,
    ToolResultBlock,
    ToolUseBlock,
    invalid_at,
    invalid_field,
)
from app.engine.dialects.openai_chat_schema import ChatCompletionRequest
from app.engine.schema import ApiError, parse_request


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
        if request.speculative is not None:
            body["speculative"] = request.speculative.model_dump(exclude_none=True)
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
        text = system if isinstance(system, str) else _system_text(system)
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
    return _context_before_the_question(messages, origins)


# Claude Code's first system block names its version and a hash of the session's first
# prompt ("x-anthropic-billing-header: cc_version=2.1.197.84c; ..."): attribution for
# Anthropic's API, meaningless to a local model, and different in nearly every session.
# Left in, it sits before the 18k tokens of tools and every new session reads them all
# again; left out, the saved prefix of the last session serves the next
# (backends/caches/disk_prefixes.py).
BILLING_HEADER = "x-anthropic-billing-header:"


def _system_text(blocks: list[TextBlock]) -> str:
    """The system prompt's blocks as one text, without the per-session billing header."""
    kept = [block.text for block in blocks if not block.text.startswith(BILLING_HEADER)]
    return "\n".join(kept)


def _context_before_the_question(
    messages: list[dict[str, Any]], origins: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """System turns sent between the first user message and the first reply, moved
    just before that user message.

    Claude Code sends its agent types and skills (~1,400 tokens) as a system turn after
    the session's first question. Where they stand, each new session's question comes
    before them and they are read again; before the question, they belong to the
    prefix every session shares. Every request of a session moves them the same way,
    so the model reads one conversation throughout it.
    """
    roles = [message["role"] for message in messages]
    if "user" not in roles:
        return messages, origins
    first_user = roles.index("user")
    end = next(
        (i for i in range(first_user, len(roles)) if roles[i] in ("assistant", "tool")),
        len(roles),
    )
    moved = [i for i in range(first_user, end) if roles[i] == "system"]
    if not moved:
        return messages, origins
    order = (
        list(range(first_user))
        + moved
        + [i for i in range(first_user, len(roles)) if i not in moved]
    )
    return [messages[i] for i in order], [origins[i] for i in order]


def _block(raw: dict[str, Any], role: str, where: str) -> Lenient:
    """One content block, validated; a 400 naming it when it cannot be read."""
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise invalid_at(where, 'a content block needs a "type" (text, tool_use, tool_result...)')
    if kind in UNREADABLE_BLOCKS:
        raise invalid_at(
            where,
            f"{kind} blocks are not supported: draftpen serves text models, which cannot "
            f"read {UNREADABLE_BLOCKS[kind]}. Send the content as text instead",
        )
    if kind not in ROLE_BLOCKS[role]:
        allowed = ", ".join(sorted(ROLE_BLOCKS[role]))
        raise invalid_at(where, f"a {role} message cannot hold {kind!r} blocks here ({allowed})")
    try:
        return BLOCKS[kind].model_validate(raw)
    except ValidationError as error:
        raise invalid_field(error, where) from None


def _assistant_message(blocks: list[Lenient]) -> dict[str, Any]:
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
                readable = UNREADABLE_BLOCKS.get(kind, f"{kind!r} blocks")  # type: ignore[arg-type]
                raise invalid_at(
                    inner,
                    f"a tool result here may hold text blocks only: draftpen serves text "
                    f"models, which cannot read {readable}",
                )
            try:
                parts.append(TextBlock.model_validate(raw).text)
            except ValidationError as error:
                raise invalid_field(error, inner) from None
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
                raise invalid_at(
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
