"""OpenAI's Responses API (``/v1/responses``) with the official ``openai`` SDK: text, tools
and reasoning.

The scripted byte models (tests/support/byte_model.py: a Hermes-style template that takes
tools; tests/support/thinking_model.py: Qwen3's template, which thinks aloud) write exactly
the replies each test needs. The real starter pair is in
tests/engine/test_openai_responses_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.engine.responses_helpers import (
    HELLO,
    QUESTION,
    WEATHER,
)
from tests.support.scripted_tools import ANSWER, PARIS_CALL, TWO_CALLS, prompt_text, scripted_server
from tests.support.thinking_model import ThinkingByteModel, thinking_reply

TIME = {
    "type": "function",
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
}

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


def test_an_output_the_client_adds_by_name_is_a_user_turn_that_names_it(tmp_path: Path):
    # Codex 0.169 sends its goal as an output of no call, by name and namespace.
    goal = {
        "type": "function_call_output",
        "id": "fco_1",
        "name": "goal_objective",
        "namespace": "agent",
        "output": "Create inventory/store.py",
    }
    with scripted_server(tmp_path, [ANSWER]) as (sdk, _, engine):
        response = sdk.responses.create(
            model="scripted", input=[*QUESTION, goal], tools=[WEATHER], store=False
        )
    assert response.output_text == ANSWER
    shown = prompt_text(engine, 0)
    assert "[agent.goal_objective]\nCreate inventory/store.py" in shown
    assert "<tool_response>" not in shown


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
