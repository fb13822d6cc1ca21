"""An in-process server over a scripted byte model behind a Hermes-style template, for
tests of tools over the socket: the tools, the calls the model writes, and reading
streamed calls back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai

from app.engine.runner import AgentServer
from app.settings import Settings
from backends.base import ChatMessage, ToolSpec
from backends.output.chat_template import render_chat
from tests.support.byte_model import BYTE_OFFSET, ScriptedByteModel
from tests.support.tui_helpers import RecordingEngine

# A Hermes-style template in the byte model's own turn markers: it shows the tools,
# replays earlier calls in <tool_call> blocks and tool results in <tool_response>.
HERMES_TEMPLATE = (
    "{% if tools %}<|user|>Tools:{% for tool in tools %} {{ tool | tojson }}{% endfor %}"
    ' Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>{% endif %}'
    "{% for message in messages %}"
    "{% if message.role == 'assistant' %}<|assistant|>{{ message.content }}"
    "{% for call in message.tool_calls or [] %}"
    "<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}<eos>"
    "{% elif message.role == 'tool' %}<|user|><tool_response>{{ message.content }}"
    "</tool_response>"
    "{% else %}<|user|>{{ message.content }}{% endif %}"
    "{% endfor %}<|assistant|>"
)


class HermesScriptedModel(ScriptedByteModel):
    """Scripted replies behind a real Jinja template that takes tools."""

    chat_template = HERMES_TEMPLATE

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> str:
        """The conversation in :data:`HERMES_TEMPLATE`."""
        return render_chat(self.chat_template, messages, tools=tools)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
PARIS_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO_CALLS = (
    "Looking both up.\n"
    + PARIS_CALL
    + '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>'
)
ANSWER = "It is 18 °C and sunny in Paris."


@contextmanager
def scripted_server(
    tmp_path: Path, replies: Sequence[str], model: type[ScriptedByteModel] = HermesScriptedModel
) -> Iterator[tuple[openai.OpenAI, httpx.Client, RecordingEngine]]:
    """An in-process ``draftpen serve`` over a scripted model; the SDK and httpx on it."""
    engine = RecordingEngine(model(replies))
    path = tmp_path / "tools.sock"
    server = AgentServer(
        engine,
        model_id="scripted",
        socket_path=path,
        settings=Settings(drafter="none"),
        configure_logging=False,
    )
    listening = threading.Event()
    thread = threading.Thread(target=server.run, kwargs={"announce": lambda _: listening.set()})
    thread.start()
    try:
        assert listening.wait(10)
        sdk = openai.OpenAI(
            api_key="unused",
            base_url="http://draftpen/v1",
            http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=30),
            max_retries=0,
        )
        raw = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(path)), base_url="http://draftpen", timeout=30
        )
        with raw:
            yield sdk, raw, engine
    finally:
        server.stop()
        thread.join(10)


def prompt_text(engine: RecordingEngine, index: int) -> str:
    """The prompt of the engine's request ``index``, as the byte model read it."""
    tokens = engine.requests[index].prompt_tokens
    return bytes(token - BYTE_OFFSET for token in tokens if token >= BYTE_OFFSET).decode()


def reassemble(chunks: list[Any]) -> dict[str, Any]:
    """The message and finish reason that a stream's deltas add up to."""
    content: str | None = None
    calls: dict[int, dict[str, Any]] = {}
    finish_reason = None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.content:
            content = (content or "") + delta.content
        for call in delta.tool_calls or ():
            entry = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
            if call.id:
                entry["id"] = call.id
            if call.function and call.function.name:
                entry["name"] = call.function.name
            if call.function and call.function.arguments:
                entry["arguments"] += call.function.arguments
        finish_reason = choice.finish_reason or finish_reason
    return {
        "content": content,
        "tool_calls": [calls[index] for index in sorted(calls)] or None,
        "finish_reason": finish_reason,
    }


def flat(response: Any) -> dict[str, Any]:
    """A non-streamed response in :func:`reassemble`'s shape."""
    choice = response.choices[0]
    calls = choice.message.tool_calls
    return {
        "content": choice.message.content,
        "tool_calls": [
            {"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
            for call in calls
        ]
        if calls
        else None,
        "finish_reason": choice.finish_reason,
    }


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    calls = message["tool_calls"]
    return {
        **message,
        "tool_calls": [{**call, "id": None} for call in calls] if calls else None,
    }
