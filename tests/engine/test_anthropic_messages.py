"""Anthropic's Messages API, spoken by the official ``anthropic`` SDK to the real server.

The fast tests serve a scripted byte model (a Hermes-style template that takes tools, or
Qwen3's template for thinking) in-process on a real Unix socket and a real TCP port
with its API key, so the shapes (blocks, events, stop reasons, usage, errors) are
checked against exactly known replies. Where generation itself matters (a forced tool
call, a tool result answered) and for Claude Code itself, see
tests/test_anthropic_messages_real.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from app.engine.queue import DEFAULT_QUEUE_LIMIT
from app.engine.runner import AgentServer
from app.settings import Settings
from backends.output.output_constraints import ConstraintSpec
from tests.engine.test_server_tools import (
    ANSWER,
    PARIS_CALL,
    TWO_CALLS,
    HermesScriptedModel,
    prompt_text,
)
from tests.support.byte_model import ScriptedByteModel
from tests.support.thinking_model import EMPTY_THINK, ThinkingByteModel, thinking_reply
from tests.support.tui_helpers import RecordingEngine

API_KEY = "test-key-for-tcp"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME_TOOL = {
    "name": "get_time",
    "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}},
}
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


@dataclass
class Served:
    """An in-process server over a scripted engine, and the ways to reach it."""

    socket_path: Path
    tcp_url: str
    engine: RecordingEngine

    def sdk(self) -> anthropic.Anthropic:
        """The official SDK, unchanged, over the Unix socket (no key needed there)."""
        transport = httpx2.HTTPTransport(uds=str(self.socket_path))
        return anthropic.Anthropic(
            api_key="unused",
            base_url="http://draftpen",
            http_client=httpx2.Client(transport=transport, timeout=30),
            max_retries=0,
        )

    def raw(self) -> httpx.Client:
        """httpx over the socket, for what the SDK does not show (raw events, bad bodies)."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return httpx.Client(transport=transport, base_url="http://draftpen", timeout=30)


@contextmanager
def messages_server(
    tmp_path: Path,
    replies: Sequence[str],
    model: type[ScriptedByteModel] = HermesScriptedModel,
    queue_limit: int = DEFAULT_QUEUE_LIMIT,
    **model_options: Any,
) -> Iterator[Served]:
    """The real server (Unix socket, and TCP on a free port with :data:`API_KEY`)."""
    engine = RecordingEngine(model(replies, **model_options))
    path = tmp_path / "messages.sock"
    server = AgentServer(
        engine,
        model_id="scripted",
        socket_path=path,
        settings=Settings(drafter="none"),
        configure_logging=False,
        tcp=("127.0.0.1", 0),
        api_key=API_KEY,
        queue_limit=queue_limit,
    )
    addresses: list[str] = []
    listening = threading.Event()

    def announce(address: str) -> None:
        addresses.append(address)
        if address.startswith("http"):
            listening.set()

    thread = threading.Thread(target=server.run, kwargs={"announce": announce})
    thread.start()
    try:
        assert listening.wait(10)
        yield Served(path, addresses[-1].removesuffix("/v1"), engine)
    finally:
        server.stop()
        thread.join(10)


def create(sdk: anthropic.Anthropic, **fields: Any) -> Any:
    """``messages.create`` on the scripted model, greedy, with room to finish."""
    return sdk.messages.create(
        **{"model": "scripted", "max_tokens": 400, "messages": QUESTION, **fields}
    )


def raw_events(raw: httpx.Client, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A stream's events as sent: (event name, data), pings included."""
    request = {"model": "scripted", "max_tokens": 400, "messages": QUESTION, **body}
    events: list[tuple[str, dict[str, Any]]] = []
    name = ""
    with raw.stream("POST", "/v1/messages", json={**request, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name  # every event names its own type
                events.append((name, data))
    return events


def blocks(message: Any) -> list[dict[str, Any]]:
    """A message's content blocks as plain dicts, call ids left out."""
    dumped = [block.model_dump(exclude_none=True) for block in message.content]
    return [{key: value for key, value in block.items() if key != "id"} for block in dumped]


# -- text, streamed and not ---------------------------------------------------------------


def test_a_message_whole_and_streamed_has_anthropics_shape_and_event_order(tmp_path: Path):
    with messages_server(tmp_path, [ANSWER]) as served:
        sdk = served.sdk()
        whole = create(sdk)
        with sdk.messages.stream(model="scripted", max_tokens=400, messages=QUESTION) as stream:
            texts = list(stream.text_stream)
            streamed = stream.get_final_message()
        events = raw_events(served.raw(), {})

    assert whole.id.startswith("msg_") and whole.type == "message" and whole.role == "assistant"
    assert whole.model == "scripted"
    assert blocks(whole) == [{"type": "text", "text": ANSWER}]
    assert (whole.stop_reason, whole.stop_sequence) == ("end_turn", None)
    # One byte token per UTF-8 byte; the prompt read whole the first time.
    assert whole.usage.output_tokens == len(ANSWER.encode())
    assert whole.usage.input_tokens > len("Weather in Paris?")
    assert whole.usage.cache_read_input_tokens == 0
    assert (whole.model_extra or {})["draftpen"]["generated_tokens"] == len(ANSWER.encode())

    assert "".join(texts) == ANSWER
    assert blocks(streamed) == blocks(whole) and streamed.stop_reason == "end_turn"
    # The same prompt again: all but its last token are found in the engine's cache.
    cached = streamed.usage.cache_read_input_tokens
    assert cached and cached + streamed.usage.input_tokens == whole.usage.input_tokens

    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["output_tokens"] == 0
    assert events[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(delta["type"] == "text_delta" for delta in deltas)
    assert "".join(delta["text"] for delta in deltas) == ANSWER
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == len(ANSWER.encode())
    assert final["draftpen"]["generated_tokens"] == len(ANSWER.encode())


# -- tools ------------------------------------------------------------------------------


def test_tool_use_then_tool_result_round_trip_through_the_models_template(tmp_path: Path):
    with messages_server(tmp_path, [PARIS_CALL, ANSWER, ANSWER]) as served:
        sdk = served.sdk()
        first = create(sdk, tools=[WEATHER_TOOL])
        [call] = first.content
        assert first.stop_reason == "tool_use"
        assert call.type == "tool_use" and call.name == "get_weather"
        assert call.input == {"city": "Paris"}

        def answered(result: dict[str, Any]) -> Any:
            conversation = [
                *QUESTION,
                {"role": "assistant", "content": [c.model_dump() for c in first.content]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call.id, **result}],
                },
            ]
            return create(sdk, tools=[WEATHER_TOOL], messages=conversation)

        second = answered({"content": "18 C, sunny"})
        failed = answered({"content": [{"type": "text", "text": "no such city"}], "is_error": True})
        engine = served.engine

    assert blocks(second) == [{"type": "text", "text": ANSWER}]
    assert second.stop_reason == "end_turn"
    shown = prompt_text(engine, 1)
    assert '"name": "get_weather", "description": "The current weather in a city"' in shown
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in shown
    assert "<tool_response>18 C, sunny</tool_response>" in shown
    # Chat templates have no error flag: an error result says so in its text.
    assert "<tool_response>Error: no such city</tool_response>" in prompt_text(engine, 2)
    assert failed.stop_reason == "end_turn"


def test_streamed_calls_are_blocks_of_their_own_and_add_up_to_the_whole_message(
    tmp_path: Path,
):
    tools = [WEATHER_TOOL, TIME_TOOL]
    with messages_server(tmp_path, [TWO_CALLS]) as served:
        sdk = served.sdk()
        whole = create(sdk, tools=tools)
        with sdk.messages.stream(
            model="scripted", max_tokens=400, messages=QUESTION, tools=tools
        ) as stream:
            streamed = stream.get_final_message()
        events = raw_events(served.raw(), {"tools": tools})

    assert blocks(whole) == [
        {"type": "text", "text": "Looking both up."},
        {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "name": "get_time", "input": {"zone": "Europe/Paris"}},
    ]
    assert whole.stop_reason == "tool_use"
    assert blocks(streamed) == blocks(whole) and streamed.stop_reason == "tool_use"

    starts = [data for name, data in events if name == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [
        (0, "text"),
        (1, "tool_use"),
        (2, "tool_use"),
    ]
    assert starts[1]["content_block"]["input"] == {}
    assert starts[1]["content_block"]["id"] != starts[2]["content_block"]["id"]
    stops = [data["index"] for name, data in events if name == "content_block_stop"]
    assert stops == [0, 1, 2]
    # A call's arguments come as input_json_delta fragments of its own block only.
    for index, expected in ((1, {"city": "Paris"}), (2, {"zone": "Europe/Paris"})):
        fragments = [
            data["delta"]
            for name, data in events
            if name == "content_block_delta" and data["index"] == index
        ]
        assert {fragment["type"] for fragment in fragments} == {"input_json_delta"}
        assert json.loads("".join(f["partial_json"] for f in fragments)) == expected
    text = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert not any("<tool_call>" in delta.get("text", "") for delta in text)


def test_tool_choice_any_and_tool_require_a_call_and_none_hides_the_tools(tmp_path: Path):
    tools = [WEATHER_TOOL, TIME_TOOL]
    with messages_server(tmp_path, [PARIS_CALL]) as served:
        sdk = served.sdk()
        create(sdk, tools=tools, tool_choice={"type": "any"})
        create(
            sdk,
            tools=tools,
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        )
        create(sdk, tools=tools, tool_choice={"type": "auto"})
        plain = create(sdk, tools=tools, tool_choice={"type": "none"})
        requests = served.engine.requests
        hidden = prompt_text(served.engine, 3)

    def calls(index: int) -> Any:
        constraint = requests[index].constraint
        assert isinstance(constraint, ConstraintSpec) and constraint.tool_calls is not None
        return constraint.tool_calls

    forced_any, forced_one, free = calls(0), calls(1), calls(2)
    assert forced_any.mode == "required" and forced_any.parallel
    assert [tool.name for tool in forced_any.tools] == ["get_weather", "get_time"]
    assert forced_one.mode == "required" and not forced_one.parallel
    assert [tool.name for tool in forced_one.tools] == ["get_weather"]
    assert free.mode == "auto"
    assert requests[3].constraint is None and "get_weather" not in hidden
    # Shown no tools, the model's call syntax is plain text to it.
    assert plain.stop_reason == "end_turn" and plain.content[0].type == "text"


def test_agents_tool_schemas_with_keywords_the_grammar_lacks_are_served(tmp_path: Path):
    # Claude Code's own tools use JSON Schema keywords llguidance does not implement
    # (propertyNames); a tool that is not strict is constrained with them unchecked.
    settings_tool = {
        "name": "set_env",
        "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "env": {"type": "object", "propertyNames": {"pattern": "^[A-Z_]+$"}},
            },
            "additionalProperties": False,
        },
    }
    with messages_server(tmp_path, [PARIS_CALL]) as served:
        sdk = served.sdk()
        answer = create(sdk, tools=[WEATHER_TOOL, settings_tool])
        with pytest.raises(anthropic.BadRequestError, match="propertyNames"):
            create(sdk, tools=[WEATHER_TOOL, {**settings_tool, "strict": True}])
    assert answer.stop_reason == "tool_use" and answer.content[0].input == {"city": "Paris"}


def test_output_config_format_constrains_the_reply_to_its_schema(tmp_path: Path):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    with messages_server(tmp_path, ['{"city": "Paris"}']) as served:
        sdk = served.sdk()
        answer = create(
            sdk,
            output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"},
        )
        with pytest.raises(anthropic.BadRequestError, match=r"output_config\.format\.schema"):
            create(sdk, output_config={"format": {"type": "json_schema", "schema": {"type": 5}}})
        constraint = served.engine.requests[0].constraint
    assert blocks(answer) == [{"type": "text", "text": '{"city": "Paris"}'}]
    assert isinstance(constraint, ConstraintSpec) and constraint.text is not None
    assert constraint.text.schema == schema and constraint.text.strict


# -- thinking ---------------------------------------------------------------------------

REASONING = "The user wants the weather.\nI should answer briefly."
THINKING_ANSWER = "It is sunny in Paris."


def test_thinking_comes_back_as_a_thinking_block_and_disabled_turns_the_switch_off(
    tmp_path: Path,
):
    reply = thinking_reply(REASONING, THINKING_ANSWER)
    with messages_server(tmp_path, [reply], ThinkingByteModel) as served:
        sdk = served.sdk()
        whole = create(sdk, thinking={"type": "enabled", "budget_tokens": 1024})
        events = raw_events(served.raw(), {"thinking": {"type": "adaptive"}})
        with sdk.messages.stream(model="scripted", max_tokens=400, messages=QUESTION) as stream:
            streamed = stream.get_final_message()
        off = create(sdk, thinking={"type": "disabled"})
        off_prompt = prompt_text(served.engine, 3)

    expected = [
        {"type": "thinking", "thinking": REASONING, "signature": ""},
        {"type": "text", "text": THINKING_ANSWER},
    ]
    assert blocks(whole) == expected and blocks(streamed) == expected
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [block["type"] for block in starts] == ["thinking", "text"]
    thinking = [
        data["delta"]
        for name, data in events
        if name == "content_block_delta" and data["index"] == 0
    ]
    assert {delta["type"] for delta in thinking} == {"thinking_delta"}
    assert "".join(delta["thinking"] for delta in thinking) == REASONING
    # Thinking off: the template closes an empty think block and the model just answers.
    assert EMPTY_THINK in off_prompt
    assert blocks(off) == [{"type": "text", "text": THINKING_ANSWER}]


# -- how a reply ends -------------------------------------------------------------------


def test_stop_sequences_and_max_tokens_name_the_stop_reason(tmp_path: Path):
    with messages_server(tmp_path, ["Hello. STOP here, END."]) as served:
        sdk = served.sdk()
        stopped = create(sdk, stop_sequences=["END", "STOP"])
        unmatched = create(sdk, stop_sequences=["never"])
        cut = create(sdk, max_tokens=3)
        events = raw_events(served.raw(), {"stop_sequences": ["END", "STOP"]})
        cut_events = raw_events(served.raw(), {"max_tokens": 3})

    assert blocks(stopped) == [{"type": "text", "text": "Hello. "}]
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "STOP")
    assert (unmatched.stop_reason, unmatched.stop_sequence) == ("end_turn", None)
    assert blocks(unmatched) == [{"type": "text", "text": "Hello. STOP here, END."}]
    assert (cut.stop_reason, blocks(cut)) == ("max_tokens", [{"type": "text", "text": "Hel"}])
    assert cut.usage.output_tokens == 3
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}
    assert cut_events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


# -- errors -----------------------------------------------------------------------------


def test_images_and_documents_get_a_400_naming_the_block(tmp_path: Path):
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
    }
    with messages_server(tmp_path, [ANSWER]) as served:
        sdk = served.sdk()
        with pytest.raises(anthropic.BadRequestError) as in_message:
            create(
                sdk,
                messages=[
                    {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
                ],
            )
        with pytest.raises(anthropic.BadRequestError) as in_result:
            create(
                sdk,
                tools=[WEATHER_TOOL],
                messages=[
                    *QUESTION,
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t1", "content": [image]}
                        ],
                    },
                ],
            )
        document = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "x"},
        }
        with pytest.raises(anthropic.BadRequestError) as as_document:
            create(sdk, messages=[{"role": "user", "content": [document]}])
        assert served.engine.requests == []

    body = in_message.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert set(body["error"]) == {"type", "message"}
    assert "messages[0].content[1]" in body["error"]["message"]
    assert "image blocks are not supported" in body["error"]["message"]
    assert "messages[2].content[0].content[0]" in in_result.value.message
    assert "images" in in_result.value.message
    assert "document blocks are not supported" in as_document.value.message


BAD_REQUESTS = [
    pytest.param({"model": "missing"}, 404, "not_found_error", "missing", id="unknown-model"),
    pytest.param(
        {"max_tokens": None}, 400, "invalid_request_error", "max_tokens", id="no-max-tokens"
    ),
    pytest.param(
        {"temperature": "hot"}, 400, "invalid_request_error", "temperature", id="temperature-type"
    ),
    pytest.param(
        {"temperature": 1.5}, 400, "invalid_request_error", "temperature", id="temperature-range"
    ),
    pytest.param(
        {"messages": [{"role": "robot", "content": "hi"}]},
        400,
        "invalid_request_error",
        "messages[0].role",
        id="role",
    ),
    pytest.param(
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}
            ]
        },
        400,
        "invalid_request_error",
        "messages[0].content[0].tool_use_id",
        id="result-for-no-call",
    ),
    pytest.param(
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "get_time"}},
        400,
        "invalid_request_error",
        "get_time",
        id="tool-choice-not-offered",
    ),
    pytest.param(
        {"tools": [{"name": "f", "input_schema": {"type": "object", "required": "x"}}]},
        400,
        "invalid_request_error",
        "tools[0].input_schema",
        id="schema-not-a-schema",
    ),
    pytest.param(
        {"tools": [{"name": "f"}]}, 400, "invalid_request_error", "input_schema", id="no-schema"
    ),
]


@pytest.mark.parametrize(("fields", "status", "kind", "named"), BAD_REQUESTS)
def test_bad_requests_get_anthropics_error_shape(
    tmp_path: Path, fields: dict[str, Any], status: int, kind: str, named: str
):
    body = {"model": "scripted", "max_tokens": 10, "messages": QUESTION, **fields}
    body = {key: value for key, value in body.items() if value is not None}
    with messages_server(tmp_path, [ANSWER]) as served, served.raw() as raw:
        response = raw.post("/v1/messages", json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert named in error["error"]["message"] and len(error["error"]["message"]) > 30


def test_routes_and_bodies_the_server_cannot_take_answer_in_anthropics_shape(tmp_path: Path):
    with messages_server(tmp_path, [ANSWER]) as served, served.raw() as raw:
        wrong_method = raw.get("/v1/messages")
        wrong_path = raw.post("/v1/messages/batches", json={})
        not_json = raw.post(
            "/v1/messages", content=b"{", headers={"content-type": "application/json"}
        )
        not_object = raw.post("/v1/messages", json=[1])
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"
    assert wrong_path.status_code == 404
    assert wrong_path.json()["error"]["type"] == "not_found_error"
    assert "POST /v1/messages" in wrong_path.json()["error"]["message"]
    for response in (not_json, not_object):
        assert response.status_code == 400
        assert response.json()["type"] == "error"


def test_a_full_queue_answers_529_overloaded_with_retry_after(tmp_path: Path):
    with messages_server(tmp_path, [ANSWER], queue_limit=0, hold_after=2) as served:
        model = served.engine.target
        assert isinstance(model, ScriptedByteModel)
        holder = threading.Thread(target=create, args=(served.sdk(),))
        holder.start()
        try:
            assert model.holding.wait(10)
            with pytest.raises(anthropic.OverloadedError) as refused:
                create(served.sdk())
            with served.raw() as raw:
                counted = raw.post(
                    "/v1/messages/count_tokens", json={"model": "scripted", "messages": QUESTION}
                )
        finally:
            model.release.set()
            holder.join(10)
    assert refused.value.status_code == 529
    assert refused.value.body["error"]["type"] == "overloaded_error"
    assert refused.value.response.headers["retry-after"] == "2"
    assert counted.status_code == 529 and counted.json()["error"]["type"] == "overloaded_error"


# -- count_tokens, headers, TCP ---------------------------------------------------------


def test_count_tokens_is_the_prompt_the_engine_reads(tmp_path: Path):
    conversation = {
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": QUESTION,
        "tools": [WEATHER_TOOL],
    }
    with messages_server(tmp_path, [ANSWER]) as served:
        sdk = served.sdk()
        counted = sdk.messages.count_tokens(model="scripted", **conversation)
        without_tools = sdk.messages.count_tokens(model="scripted", messages=QUESTION)
        answer = create(sdk, **conversation)
        read = len(served.engine.requests[0].prompt_tokens)
        with pytest.raises(anthropic.NotFoundError):
            sdk.messages.count_tokens(model="missing", messages=QUESTION)
    assert counted.input_tokens == read
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == read
    # The tools are part of the prompt the template renders.
    assert without_tools.input_tokens < read - len(json.dumps(WEATHER_TOOL["input_schema"]))


def test_fields_and_headers_claude_code_sends_are_accepted(tmp_path: Path):
    body = {
        "model": "scripted",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            },
            {"role": "system", "content": "Available agent types: none."},
        ],
        "tools": [{**WEATHER_TOOL, "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": '{"device_id": "abc"}'},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "temperature": 1,
        "top_p": 0.9,
        "top_k": 40,
    }
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
        "x-api-key": "anything",
        "authorization": "Bearer anything",
    }
    with messages_server(tmp_path, [ANSWER]) as served:
        with served.raw() as raw:
            response = raw.post("/v1/messages?beta=true", json=body, headers=headers)
        shown = prompt_text(served.engine, 0)
        params = served.engine.requests[0].params
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": ANSWER}]
    # The per-session billing header is dropped: it would end the prefix that every
    # session shares before the tools (the disk prefix cache would never be used).
    assert "x-anthropic-billing-header" not in shown and "You are an agent." in shown
    # The system turn sent after the first question stands before it, so the next
    # session's question comes after everything the sessions share.
    assert shown.index("Available agent types: none.") < shown.index("hi")
    assert shown.index("You are an agent.") < shown.index("Available agent types: none.")
    assert (params.temperature, params.top_p, params.top_k) == (1.0, 0.9, 40)


def test_the_sdk_over_tcp_needs_the_key_as_x_api_key_or_bearer(tmp_path: Path):
    with messages_server(tmp_path, [ANSWER]) as served:

        def over_tcp(**credentials: str) -> anthropic.Anthropic:
            return anthropic.Anthropic(base_url=served.tcp_url, max_retries=0, **credentials)

        keyed = create(over_tcp(api_key=API_KEY))
        with over_tcp(auth_token=API_KEY).messages.stream(
            model="scripted", max_tokens=400, messages=QUESTION
        ) as stream:
            bearer = stream.get_final_message()
        with pytest.raises(anthropic.AuthenticationError) as refused:
            create(over_tcp(api_key="wrong"))
    assert blocks(keyed) == blocks(bearer) == [{"type": "text", "text": ANSWER}]
    assert refused.value.status_code == 401
    assert refused.value.body["error"]["type"] == "authentication_error"


def test_only_system_turns_before_the_first_reply_move_before_the_question():
    from app.engine.dialects.anthropic_schema import MessagesRequest, parse_messages_request
    from app.engine.dialects.anthropic_translation import chat_request

    body = {
        "model": "scripted",
        "max_tokens": 16,
        "system": "You are an agent.",
        "messages": [
            {"role": "user", "content": "first question"},
            {"role": "system", "content": "agent types"},
            {"role": "assistant", "content": "an answer"},
            {"role": "system", "content": "a later note"},
            {"role": "user", "content": "second question"},
        ],
    }
    request = chat_request(parse_messages_request(MessagesRequest, body))
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "You are an agent."),
        ("system", "agent types"),
        ("user", "first question"),
        ("assistant", "an answer"),
        ("system", "a later note"),
        ("user", "second question"),
    ]
