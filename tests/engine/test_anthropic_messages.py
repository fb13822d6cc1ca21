"""Anthropic's Messages API, spoken by the official ``anthropic`` SDK to the real server.

The server serves a scripted byte model (a Hermes-style template that takes tools, or
Qwen3's, which thinks): a message whole and streamed, tool use and results, tool_choice,
schemas, thinking blocks, stop reasons. The real starter pair is in
tests/engine/test_anthropic_messages_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from backends.output.output_constraints import ConstraintSpec
from tests.engine.messages_server import (
    QUESTION,
    WEATHER_TOOL,
    blocks,
    create,
    messages_server,
)
from tests.support.scripted_tools import ANSWER, PARIS_CALL, TWO_CALLS, prompt_text
from tests.support.thinking_model import EMPTY_THINK, ThinkingByteModel, thinking_reply

TIME_TOOL = {
    "name": "get_time",
    "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}},
}


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
