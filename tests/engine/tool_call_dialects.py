"""One conversation with tools in each dialect, and its reply read back the same way.

An Anthropic Messages body (the form of ``shared/repro/forced_write_messages.json``) is
converted into the same conversation for OpenAI chat completions and Responses; each
answer, whole or streamed, is read into a :class:`DialectReply`: the text the client
would show (every text block / content / output_text), the calls it would run and how
the reply says it ended. Issue 41's tests hold every dialect to the same checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

DIALECTS = ("messages", "chat", "responses")
# Call syntax that no text may hold, whole or begun (a start of two characters or more).
CALL_MARKUP = ("<tool_call>", "</tool_call>", "<|python_tag|>", '{"name"')


@dataclass
class DialectReply:
    """What a client of one dialect gets: texts, calls (name, input), how it ended."""

    texts: list[str] = field(default_factory=list)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    stop: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)


def assert_no_call_markup(reply: DialectReply) -> None:
    """No text of the reply holds call syntax, or ends in the start of it."""
    for text in reply.texts:
        for markup in CALL_MARKUP:
            assert markup not in text, text
            assert not any(text.endswith(markup[:size]) for size in range(2, len(markup))), text


# -- the request in each dialect ---------------------------------------------------------


def _block_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content)


def chat_body(messages_body: dict[str, Any]) -> dict[str, Any]:
    """The Messages request as a chat completions request."""
    messages: list[dict[str, Any]] = []
    if messages_body.get("system"):
        messages.append({"role": "system", "content": _block_text(messages_body["system"])})
    for message in messages_body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            messages.append({"role": message["role"], "content": content})
            continue
        text = "".join(block["text"] for block in content if block["type"] == "text")
        calls = [
            {
                "id": block["id"],
                "type": "function",
                "function": {"name": block["name"], "arguments": json.dumps(block["input"])},
            }
            for block in content
            if block["type"] == "tool_use"
        ]
        for block in content:
            if block["type"] == "tool_result":
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": block["tool_use_id"],
                        "content": _block_text(block["content"]),
                    }
                )
        if message["role"] == "assistant":
            messages.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        elif text:
            messages.append({"role": "user", "content": text})
    body: dict[str, Any] = {
        "model": messages_body["model"],
        "messages": messages,
        "max_tokens": messages_body["max_tokens"],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool.get("description", ""),
                    "parameters": tool["input_schema"],
                },
            }
            for tool in messages_body["tools"]
        ],
    }
    for name in ("temperature", "top_p", "top_k", "speculative"):
        if name in messages_body:
            body[name] = messages_body[name]
    choice = messages_body.get("tool_choice")
    if choice is not None:
        if choice["type"] == "tool":
            body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        else:
            body["tool_choice"] = {"any": "required"}.get(choice["type"], choice["type"])
        if choice.get("disable_parallel_tool_use"):
            body["parallel_tool_calls"] = False
    return body


def responses_body(messages_body: dict[str, Any]) -> dict[str, Any]:
    """The Messages request as a Responses request (not stored)."""
    chat = chat_body(messages_body)
    items: list[dict[str, Any]] = []
    instructions = None
    for message in chat["messages"]:
        if message["role"] == "system":
            instructions = message["content"]
        elif message["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                }
            )
        elif message["role"] == "assistant":
            if message["content"]:
                items.append({"role": "assistant", "content": message["content"]})
            for call in message["tool_calls"]:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                    }
                )
        else:
            items.append({"role": "user", "content": message["content"]})
    body: dict[str, Any] = {
        "model": chat["model"],
        "input": items,
        "max_output_tokens": chat["max_tokens"],
        "store": False,
        "tools": [{"type": "function", **tool["function"]} for tool in chat["tools"]],
    }
    if instructions:
        body["instructions"] = instructions
    for name in ("temperature", "top_p", "top_k", "speculative", "parallel_tool_calls"):
        if name in chat:
            body[name] = chat[name]
    choice = chat.get("tool_choice")
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "function", "name": choice["function"]["name"]}
    elif choice is not None:
        body["tool_choice"] = choice
    return body


# -- the reply, read back ----------------------------------------------------------------


def ask(
    client: httpx.Client, dialect: str, messages_body: dict[str, Any], *, stream: bool
) -> DialectReply:
    """Send the conversation in ``dialect`` and read what its client would get."""
    if dialect == "messages":
        path, body = "/v1/messages", dict(messages_body)
    elif dialect == "chat":
        path, body = "/v1/chat/completions", chat_body(messages_body)
    else:
        path, body = "/v1/responses", responses_body(messages_body)
    body["stream"] = stream
    if not stream:
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        return _WHOLE[dialect](response.json())
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        return _STREAMED[dialect](_sse(response.iter_lines()))


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """(event name, data) for each server-sent event; ``[DONE]`` ends the stream."""
    name = ""
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                return
            yield name, json.loads(data)


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # cut off: the tests see it as written


def _whole_messages(body: dict[str, Any]) -> DialectReply:
    reply = DialectReply(stop=body["stop_reason"], stats=body["draftpen"])
    for block in body["content"]:
        if block["type"] == "text":
            reply.texts.append(block["text"])
        elif block["type"] == "tool_use":
            reply.calls.append((block["name"], block["input"]))
    return reply


def _streamed_messages(events: Iterator[tuple[str, Any]]) -> DialectReply:
    reply = DialectReply()
    arguments: list[str] = []
    for name, data in events:
        if name == "content_block_start":
            block = data["content_block"]
            if block["type"] == "text":
                reply.texts.append(block["text"])
            elif block["type"] == "tool_use":
                reply.calls.append((block["name"], None))
                arguments.append("")
        elif name == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                reply.texts[-1] += delta["text"]
            elif delta["type"] == "input_json_delta":
                arguments[-1] += delta["partial_json"]
        elif name == "message_delta":
            reply.stop = data["delta"]["stop_reason"]
            reply.stats = data["draftpen"]
    reply.calls = [
        (call, _arguments(text or "{}"))
        for (call, _), text in zip(reply.calls, arguments, strict=True)
    ]
    return reply


def _whole_chat(body: dict[str, Any]) -> DialectReply:
    choice = body["choices"][0]
    message = choice["message"]
    reply = DialectReply(stop=choice["finish_reason"], stats=body["draftpen"])
    if message["content"] is not None:
        reply.texts.append(message["content"])
    for call in message.get("tool_calls") or ():
        function = call["function"]
        reply.calls.append((function["name"], _arguments(function["arguments"])))
    return reply


def _streamed_chat(events: Iterator[tuple[str, Any]]) -> DialectReply:
    reply = DialectReply()
    content = ""
    calls: dict[int, list[str]] = {}
    for _, chunk in events:
        if not chunk.get("choices"):
            continue
        choice = chunk["choices"][0]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or ():
            entry = calls.setdefault(call["index"], ["", ""])
            entry[0] += call["function"].get("name") or ""
            entry[1] += call["function"].get("arguments") or ""
        if choice["finish_reason"] is not None:
            reply.stop = choice["finish_reason"]
        reply.stats = chunk["draftpen"]
    if content:
        reply.texts.append(content)
    reply.calls = [(name, _arguments(text)) for name, text in (calls[i] for i in sorted(calls))]
    return reply


def _whole_responses(body: dict[str, Any]) -> DialectReply:
    reply = DialectReply(stop=body["status"], stats=body.get("draftpen", {}))
    for item in body["output"]:
        if item["type"] == "message":
            reply.texts += [part["text"] for part in item["content"]]
        elif item["type"] == "function_call":
            reply.calls.append((item["name"], _arguments(item["arguments"])))
    return reply


def _streamed_responses(events: Iterator[tuple[str, Any]]) -> DialectReply:
    deltas = ""
    final: DialectReply | None = None
    for name, data in events:
        if name == "response.output_text.delta":
            deltas += data["delta"]
        elif name in ("response.completed", "response.incomplete"):
            final = _whole_responses(data["response"])
    assert final is not None, "the stream did not finish"
    # What a client shows while it streams is what the finished response holds.
    assert deltas == "".join(final.texts)
    return final


_WHOLE = {"messages": _whole_messages, "chat": _whole_chat, "responses": _whole_responses}
_STREAMED = {
    "messages": _streamed_messages,
    "chat": _streamed_chat,
    "responses": _streamed_responses,
}
