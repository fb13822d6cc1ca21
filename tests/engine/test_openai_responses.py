"""OpenAI's Responses API (``/v1/responses``) with the official ``openai`` SDK.

The scripted byte models (tests/byte_model.py: a Hermes-style template that takes tools;
tests/thinking_model.py: Qwen3's template, which thinks aloud) write exactly the replies
a test needs, behind the real server on a real Unix socket (and TCP), so shapes, event
sequences, the tool loop and the store are checked in milliseconds. The starter pair's
tests (generation, forced calls, JSON schemas, Codex CLI) are in
tests/test_openai_responses_real.py.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.engine.runner import AgentServer
from app.settings import Settings
from backends.errors import DecodeError
from tests.engine.test_server_tools import (
    ANSWER,
    PARIS_CALL,
    TWO_CALLS,
    HermesScriptedModel,
    prompt_text,
    scripted_server,
)
from tests.support.byte_model import ASSISTANT
from tests.support.thinking_model import ThinkingByteModel, thinking_reply
from tests.support.tui_helpers import RecordingEngine

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {
    "type": "function",
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
}
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
HELLO = "Hello! How can I help?"

# The event sequence of a streamed text answer, each delta counted once.
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def kinds(events: list[Any]) -> list[str]:
    """The events' types, runs of one delta type counted once."""
    seen: list[str] = []
    for event in events:
        if not (event.type.endswith(".delta") and seen and seen[-1] == event.type):
            seen.append(event.type)
    return seen


def as_input(output: list[Any]) -> list[dict[str, Any]]:
    """A response's output items sent back as input, as a client replays them."""
    return [item.model_dump(exclude_none=True) for item in output]


# -- shapes: one answer, streamed and not ---------------------------------------------


def test_a_text_answer_is_one_message_with_usage(tmp_path: Path):
    with scripted_server(tmp_path, [HELLO]) as (sdk, _, engine):
        response = sdk.responses.create(model="scripted", input="Hi", instructions="Be brief.")
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.error is None
    assert response.output_text == HELLO
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.status == "completed" and message.id.startswith("msg_")
    assert [part.type for part in message.content] == ["output_text"]
    usage = response.usage
    assert usage is not None and usage.output_tokens == len(HELLO.encode())
    assert usage.input_tokens == len(engine.requests[0].prompt_tokens)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    # The request's fields come back; the instructions are the system turn.
    assert response.instructions == "Be brief." and response.store is True
    assert response.model == "scripted" and response.tools == []
    assert prompt_text(engine, 0) == "Be brief.Hi"  # (the markers are special tokens)
    assert (response.model_extra or {})["draftpen"]["generated_tokens"] == usage.output_tokens


def test_a_stream_sends_the_responses_events_in_order(tmp_path: Path):
    with scripted_server(tmp_path, [HELLO]) as (sdk, _, _):
        events = list(sdk.responses.create(model="scripted", input="Hi", stream=True))
        with sdk.responses.stream(model="scripted", input="Hi") as helper:
            final = helper.get_final_response()
    assert kinds(events) == TEXT_EVENTS
    assert [event.sequence_number for event in events] == list(range(len(events)))
    created, completed = events[0].response, events[-1].response
    assert created.status == "in_progress" and created.output == []
    assert completed.status == "completed" and completed.id == created.id
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == HELLO
    [text_done] = [event for event in events if event.type == "response.output_text.done"]
    assert text_done.text == HELLO
    added, done = (event for event in events if event.type.startswith("response.output_item"))
    assert added.item.status == "in_progress" and done.item.status == "completed"
    assert added.item.id == done.item.id == text_done.item_id == completed.output[0].id
    assert completed.output_text == HELLO and completed.usage.output_tokens > 0
    # The SDK's stream helper puts the same response together from the events.
    assert final.output_text == HELLO and final.status == "completed"


def test_max_output_tokens_ends_the_response_incomplete(tmp_path: Path):
    with scripted_server(tmp_path, [HELLO]) as (sdk, _, _):
        whole = sdk.responses.create(model="scripted", input="Hi", max_output_tokens=5)
        events = list(
            sdk.responses.create(model="scripted", input="Hi", max_output_tokens=5, stream=True)
        )
    assert whole.status == "incomplete" and whole.output_text == HELLO[:5]
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == HELLO[:5]


# -- function tools -------------------------------------------------------------------


def test_a_function_call_and_its_output_make_a_tool_loop(tmp_path: Path):
    with scripted_server(tmp_path, [PARIS_CALL, ANSWER]) as (sdk, _, engine):
        first = sdk.responses.create(model="scripted", input=QUESTION, tools=[WEATHER])
        [call] = first.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert call.call_id.startswith("call_") and call.id.startswith("fc_")
        assert json.loads(call.arguments) == {"city": "Paris"}
        assert first.status == "completed" and first.output_text == ""
        second = sdk.responses.create(
            model="scripted",
            input=[
                *QUESTION,
                *as_input(first.output),
                {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"},
            ],
            tools=[WEATHER],
            store=False,
        )
    assert second.output_text == ANSWER
    shown = prompt_text(engine, 1)
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}' in shown
    assert "<tool_response>18 C</tool_response>" in shown
    # Function tools are strict unless they say otherwise, as the Responses API's are.
    calls = engine.requests[0].constraint.tool_calls  # type: ignore[union-attr]
    assert calls is not None and calls.mode == "auto" and calls.tools[0].strict


def test_streamed_calls_build_the_same_output_as_the_whole_response(tmp_path: Path):
    request: dict[str, Any] = {"model": "scripted", "input": QUESTION, "tools": [WEATHER, TIME]}
    with scripted_server(tmp_path, [TWO_CALLS]) as (sdk, _, _):
        whole = sdk.responses.create(**request)
        events = list(sdk.responses.create(**request, stream=True))
        with sdk.responses.stream(**request) as helper:
            helped = helper.get_final_response()
    assert [item.type for item in whole.output] == ["message", "function_call", "function_call"]
    assert whole.output_text == "Looking both up."
    assert [item.name for item in whole.output[1:]] == ["get_weather", "get_time"]  # type: ignore[union-attr]

    def shape(items: list[Any]) -> list[dict[str, Any]]:
        dumped = [item.model_dump(exclude_none=True) for item in items]
        return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in dumped]

    assert shape(events[-1].response.output) == shape(whole.output) == shape(helped.output)
    assert kinds(events)[2:] == [
        *TEXT_EVENTS[2:-1],
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    arguments: dict[int, str] = {}
    for event in events:
        if event.type == "response.function_call_arguments.delta":
            arguments[event.output_index] = arguments.get(event.output_index, "") + event.delta
    assert {index: json.loads(text) for index, text in arguments.items()} == {
        1: {"city": "Paris"},
        2: {"zone": "Europe/Paris"},
    }


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "name": "get_time"}], ids=["required", "named"]
)
def test_tool_choice_required_or_named_makes_the_grammar_call(tmp_path: Path, tool_choice: Any):
    with scripted_server(tmp_path, [PARIS_CALL]) as (sdk, _, engine):
        sdk.responses.create(
            model="scripted",
            input=QUESTION,
            tools=[WEATHER, TIME],
            tool_choice=tool_choice,
            parallel_tool_calls=False,
        )
    calls = engine.requests[0].constraint.tool_calls  # type: ignore[union-attr]
    assert calls is not None and calls.mode == "required" and not calls.parallel
    named = isinstance(tool_choice, dict)
    assert [tool.name for tool in calls.tools] == (
        ["get_time"] if named else ["get_weather", "get_time"]
    )


def test_tools_a_local_model_cannot_serve_are_ignored_unless_required(tmp_path: Path):
    hosted = [{"type": "web_search"}, {"type": "local_shell"}, {"type": "custom", "name": "x"}]
    with scripted_server(tmp_path, [HELLO, HELLO]) as (sdk, raw, engine):
        response = sdk.responses.create(model="scripted", input="Hi", tools=[*hosted, WEATHER])  # type: ignore[list-item]
        assert response.output_text == HELLO
        assert [tool.name for tool in response.tools] == ["get_weather"]  # type: ignore[union-attr]
        calls = engine.requests[0].constraint.tool_calls  # type: ignore[union-attr]
        assert calls is not None and [tool.name for tool in calls.tools] == ["get_weather"]
        only_hosted = raw.post(
            "/v1/responses",
            json={"model": "scripted", "input": "Hi", "tools": hosted, "tool_choice": "required"},
        )
        forced_hosted = raw.post(
            "/v1/responses",
            json={
                "model": "scripted",
                "input": "Hi",
                "tools": hosted,
                "tool_choice": {"type": "web_search"},
            },
        )
    for refused in (only_hosted, forced_hosted):
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "tool_choice"
    assert "custom, local_shell, web_search" in only_hosted.json()["error"]["message"]
    assert "'web_search', which draftpen cannot serve" in forced_hosted.json()["error"]["message"]


def test_text_format_json_schema_becomes_the_reply_grammar(tmp_path: Path):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    with scripted_server(tmp_path, ['{"city": "Paris"}']) as (sdk, _, engine):
        response = sdk.responses.create(
            model="scripted",
            input="Which city?",
            text={
                "format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}
            },
        )
    assert json.loads(response.output_text) == {"city": "Paris"}
    constraint = engine.requests[0].constraint
    assert constraint is not None and constraint.text is not None
    assert constraint.text.schema == schema and constraint.text.strict
    assert response.text is not None and response.text.format.type == "json_schema"


# -- the store: previous_response_id, GET, DELETE -------------------------------------


def test_previous_response_id_continues_the_stored_conversation(tmp_path: Path):
    with scripted_server(tmp_path, [PARIS_CALL, ANSWER, HELLO]) as (sdk, _, engine):
        first = sdk.responses.create(
            model="scripted", input=QUESTION, tools=[WEATHER], instructions="Old rules."
        )
        [call] = first.output
        second = sdk.responses.create(
            model="scripted",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],  # type: ignore[union-attr]
            tools=[WEATHER],
        )
        third = sdk.responses.create(
            model="scripted", previous_response_id=second.id, input="Thanks!", stream=True
        )
        third_id = [event for event in third][-1].response.id
        assert sdk.responses.retrieve(first.id).output[0].id == call.id
        assert sdk.responses.retrieve(third_id).output_text == HELLO
    assert second.output_text == ANSWER and second.previous_response_id == first.id
    shown = prompt_text(engine, 2)
    for earlier in ("Weather in Paris?", '"city": "Paris"', "<tool_response>18 C", ANSWER):
        assert earlier in shown
    assert shown.endswith(f"{ANSWER}Thanks!")
    # Instructions do not carry over to the next response.
    assert "Old rules." in prompt_text(engine, 0) and "Old rules." not in shown


def test_get_and_delete_a_stored_response_and_store_false_keeps_nothing(tmp_path: Path):
    with scripted_server(tmp_path, [HELLO]) as (sdk, _, _):
        kept = sdk.responses.create(model="scripted", input="Hi")
        fetched = sdk.responses.retrieve(kept.id)
        assert fetched.model_dump() == kept.model_dump()
        sdk.responses.delete(kept.id)
        with pytest.raises(openai.NotFoundError, match="No response with id"):
            sdk.responses.retrieve(kept.id)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.delete(kept.id)
        passing = sdk.responses.create(model="scripted", input="Hi", store=False)
        assert passing.store is False
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(passing.id)
        with pytest.raises(openai.NotFoundError) as unknown:
            sdk.responses.create(model="scripted", input="Hi", previous_response_id=passing.id)
    error = unknown.value.body
    assert isinstance(error, dict) and error["param"] == "previous_response_id"
    assert error["code"] == "response_not_found" and passing.id in error["message"]


def test_truncation_auto_leaves_out_the_oldest_turns_that_do_not_fit(tmp_path: Path):
    small = functools.partial(HermesScriptedModel, n_ctx=160)
    history = [
        {"role": "user" if turn % 2 == 0 else "assistant", "content": f"Turn {turn}: " + "x" * 30}
        for turn in range(6)
    ]
    body = {"model": "scripted", "input": [*history, {"role": "user", "content": "Hi"}]}
    with scripted_server(tmp_path, [HELLO], small) as (_, raw, engine):  # type: ignore[arg-type]
        refused = raw.post("/v1/responses", json=body)
        fitted = raw.post("/v1/responses", json={**body, "truncation": "auto"})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        assert fitted.status_code == 200, fitted.text
        assert fitted.json()["truncation"] == "auto"
        assert fitted.json()["draftpen"]["left_out_messages"] > 0
        assert prompt_text(engine, -1).endswith("Hi")


# -- a model that thinks aloud --------------------------------------------------------

REASONING = "The user wants the weather.\nI should answer briefly."
SUNNY = "It is sunny in Paris."


def test_reasoning_comes_back_as_a_reasoning_item_streamed_and_not(tmp_path: Path):
    reply = thinking_reply(REASONING, SUNNY)
    with scripted_server(tmp_path, [reply, reply], ThinkingByteModel) as (sdk, _, engine):
        whole = sdk.responses.create(model="scripted", input=QUESTION)
        events = list(sdk.responses.create(model="scripted", input=QUESTION, stream=True))
        off = sdk.responses.create(model="scripted", input=QUESTION, reasoning={"effort": "none"})
        assert prompt_text(engine, -1).endswith("<think>\n\n</think>\n\n")
        again = sdk.responses.create(
            model="scripted", input=[*QUESTION, *as_input(whole.output), *QUESTION]
        )
        assert "I should answer briefly" not in prompt_text(engine, -1)
    reasoning, _ = whole.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert [part.text for part in reasoning.content or []] == [REASONING]
    assert whole.output_text == SUNNY
    assert whole.usage is not None
    assert whole.usage.output_tokens_details.reasoning_tokens == len(
        f"<think>\n{REASONING}\n</think>"
    )
    deltas = [event.delta for event in events if event.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == REASONING
    assert kinds(events)[:8] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert events[-1].response.output_text == SUNNY
    assert [item.type for item in off.output] == ["message"] and off.output_text == SUNNY
    assert again.output_text == SUNNY


# -- errors ---------------------------------------------------------------------------

BAD_REQUESTS = [
    pytest.param({"input": 5}, "input", "invalid_type", id="input-type"),
    pytest.param(
        {"input": [{"type": "web_search_call"}]}, "input[0].type", "invalid_value", id="item-type"
    ),
    pytest.param(
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content",
        "invalid_value",
        id="image",
    ),
    pytest.param(
        {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
        "input[0].call_id",
        "invalid_value",
        id="output-for-no-call",
    ),
    pytest.param(
        {"input": [{"role": "user"}]},
        "input[0].content",
        "missing_required_parameter",
        id="no-content",
    ),
    pytest.param({"temperature": "0.5"}, "temperature", "invalid_type", id="temperature-type"),
    pytest.param({"temperature": 3}, "temperature", "invalid_value", id="temperature-range"),
    pytest.param({"max_output_tokens": 0}, "max_output_tokens", "invalid_value", id="limit"),
    pytest.param({"store": "yes"}, "store", "invalid_type", id="store-type"),
    pytest.param(
        {"tools": [{**WEATHER, "name": "bad name"}]},
        "tools[0].name",
        "invalid_value",
        id="tool-name",
    ),
    pytest.param(
        {"tools": [{**WEATHER, "parameters": {"type": "strin"}}]},
        "tools[0].parameters",
        "invalid_value",
        id="tool-schema",
    ),
    pytest.param(
        {"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]},
        "tool_choice",
        "invalid_value",
        id="named-not-offered",
    ),
    pytest.param(
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}},
        "text.format.schema",
        "invalid_value",
        id="text-schema",
    ),
    pytest.param(
        {"reasoning": {"effort": "extreme"}}, "reasoning.effort", "invalid_value", id="effort"
    ),
    pytest.param({"background": True}, "background", "invalid_value", id="background"),
]


@pytest.mark.parametrize(("fields", "param", "code"), BAD_REQUESTS)
def test_bad_fields_get_a_400_naming_the_field(
    tmp_path: Path, fields: dict[str, Any], param: str, code: str
):
    body = {"model": "scripted", "input": "Hi", **fields}
    with (
        scripted_server(tmp_path, [HELLO]) as (sdk, _, _),
        pytest.raises(openai.BadRequestError) as raised,
    ):
        sdk.responses.create(**body)
    error = raised.value.body
    assert isinstance(error, dict) and (error["param"], error["code"]) == (param, code), error
    assert len(error["message"]) > 30


def test_unknown_models_paths_and_methods_get_openai_errors(tmp_path: Path):
    with scripted_server(tmp_path, [HELLO]) as (sdk, raw, _):
        with pytest.raises(openai.NotFoundError, match="scripted"):
            sdk.responses.create(model="gpt-5", input="Hi")
        missing = raw.get("/v1/response")
        wrong_method = raw.put("/v1/responses/resp_1")
    assert missing.status_code == 404
    assert "POST /v1/responses" in missing.json()["error"]["message"]
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"]


class FailingModel(HermesScriptedModel):
    """Writes a few tokens of its reply, then the runtime fails."""

    def forward(self, tokens: Any, *, last_only: bool = False) -> Any:
        """As the byte model, until the reply is five tokens long."""
        if ASSISTANT in self._cache:
            marker = len(self._cache) - 1 - self._cache[::-1].index(ASSISTANT)
            if len(self._cache) - marker > 5:
                raise DecodeError("the runtime fell over")
        return super().forward(tokens, last_only=last_only)


def test_an_error_mid_stream_is_a_response_failed_event(tmp_path: Path):
    with scripted_server(tmp_path, [HELLO], FailingModel) as (sdk, _, _):
        events = list(sdk.responses.create(model="scripted", input="Hi", stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "generation_failed" and "fell over" in failed.error.message
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_a_codex_request_is_answered_with_its_extra_fields_ignored(tmp_path: Path):
    # The shape Codex CLI 0.169 sends: developer messages, function tools with strict
    # false, tool types a local model cannot serve, and fields that change nothing here.
    exec_command = {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
    }
    body = {
        "model": "scripted",
        "instructions": "",
        "input": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are a coding agent."}],
            },
            {
                "type": "message",
                "id": "msg_2",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Skills: none."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is 2+3?"}],
            },
        ],
        "tools": [
            exec_command,
            {"type": "namespace", "name": "multi_agent_v1", "tools": [exec_command]},
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "client_metadata": {"turn_id": "1"},
        "service_tier": "auto",
        "text": {"verbosity": "medium"},
    }
    with (
        scripted_server(tmp_path, ["5"]) as (_, raw, engine),
        raw.stream("POST", "/v1/responses", json=body) as response,
    ):
        assert response.status_code == 200
        lines = list(response.iter_lines())
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert names == [payload["type"] for payload in payloads]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    done = [p["item"] for p in payloads if p["type"] == "response.output_item.done"]
    assert done == [payloads[-1]["response"]["output"][0]]
    assert done[0]["content"][0]["text"] == "5"
    shown = prompt_text(engine, 0)
    # The two developer messages are one system turn, before the question.
    assert shown.endswith("</tool_call>You are a coding agent.\n\nSkills: none.What is 2+3?")
    calls = engine.requests[0].constraint.tool_calls  # type: ignore[union-attr]
    assert calls is not None and [tool.name for tool in calls.tools] == ["exec_command"]
    assert not calls.tools[0].strict


# -- over TCP -------------------------------------------------------------------------


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def tcp_server(tmp_path: Path, replies: list[str]) -> Iterator[openai.OpenAI]:
    """An in-process server over a scripted model, on TCP with a key; the SDK on it."""
    port = free_port()
    server = AgentServer(
        RecordingEngine(HermesScriptedModel(replies)),
        model_id="scripted",
        socket_path=tmp_path / "tcp.sock",
        settings=Settings(drafter="none"),
        configure_logging=False,
        tcp=("127.0.0.1", port),
        api_key="responses-test-key",
    )
    listening = threading.Event()
    thread = threading.Thread(target=server.run, kwargs={"announce": lambda _: listening.set()})
    thread.start()
    try:
        assert listening.wait(10)
        yield openai.OpenAI(
            api_key="responses-test-key",
            base_url=f"http://127.0.0.1:{port}/v1",
            max_retries=0,
            http_client=httpx.Client(timeout=30),
        )
    finally:
        server.stop()
        thread.join(10)


def test_the_sdk_works_over_tcp_streamed_and_not(tmp_path: Path):
    with tcp_server(tmp_path, [PARIS_CALL]) as sdk:
        whole = sdk.responses.create(model="scripted", input=QUESTION, tools=[WEATHER])  # type: ignore[list-item]
        events = list(sdk.responses.create(model="scripted", input="Hi", stream=True))
        kept = sdk.responses.retrieve(whole.id)
    assert [item.type for item in whole.output] == ["function_call"]
    assert kept.output[0].id == whole.output[0].id
    assert events[-1].type == "response.completed"
