"""Tools and structured-output fields over the socket, with the official ``openai`` SDK.

A scripted byte model (tests/support/byte_model.py) with a Hermes-style Jinja template
writes the calls each test needs (tests/support/scripted_tools.py); the real starter
pair is in tests/engine/test_server_tools_starter.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from backends.output.output_constraints import ConstraintSpec
from tests.support.byte_model import ScriptedByteModel
from tests.support.scripted_tools import (
    ANSWER,
    PARIS_CALL,
    TWO_CALLS,
    WEATHER_TOOL,
    flat,
    prompt_text,
    reassemble,
    scripted_server,
    without_ids,
)

TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}


# -- a scripted model, in-process -------------------------------------------------------


def test_tool_loop_call_result_answer_through_the_models_template(tmp_path: Path):
    with scripted_server(tmp_path, [PARIS_CALL, ANSWER]) as (sdk, _, engine):
        question = [{"role": "user", "content": "Weather in Paris?"}]
        first = sdk.chat.completions.create(
            model="scripted", messages=question, tools=[WEATHER_TOOL]
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        [call] = choice.message.tool_calls or []
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}

        conversation = [
            *question,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
        ]
        second = sdk.chat.completions.create(
            model="scripted", messages=conversation, tools=[WEATHER_TOOL]
        )
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls is None
    shown = prompt_text(engine, 1)
    assert '"name": "get_weather", "description": "The current weather in a city"' in shown
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in shown
    assert "<tool_response>18 C, sunny</tool_response>" in shown
    constraint = engine.requests[0].constraint
    assert isinstance(constraint, ConstraintSpec) and constraint.tool_calls is not None
    assert constraint.tool_calls.mode == "auto" and constraint.tool_calls.syntax.family == "hermes"


def test_streamed_parallel_calls_reassemble_to_the_whole_response(tmp_path: Path):
    request = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "Weather and time in Paris?"}],
        "tools": [WEATHER_TOOL, TIME_TOOL],
    }
    with scripted_server(tmp_path, [TWO_CALLS]) as (sdk, _, _):
        whole = sdk.chat.completions.create(**request)
        chunks = list(sdk.chat.completions.create(**request, stream=True))
    expected = flat(whole)
    assert expected["content"] == "Looking both up."
    assert [call["name"] for call in expected["tool_calls"]] == ["get_weather", "get_time"]
    assert expected["finish_reason"] == "tool_calls"
    assert without_ids(reassemble(chunks)) == without_ids(expected)

    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    assert deltas[0].role == "assistant"
    assert not any("<tool_call>" in (delta.content or "") for delta in deltas)
    starts = [call for delta in deltas for call in delta.tool_calls or () if call.id]
    assert [(call.index, call.type, call.function.arguments) for call in starts] == [
        (0, "function", ""),
        (1, "function", ""),
    ]
    fragments = [call for delta in deltas for call in delta.tool_calls or () if not call.id]
    assert fragments and all(call.function.name is None for call in fragments)


def test_parallel_tool_calls_false_answers_one_call(tmp_path: Path):
    with scripted_server(tmp_path, [TWO_CALLS]) as (sdk, _, engine):
        response = sdk.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Weather and time?"}],
            tools=[WEATHER_TOOL, TIME_TOOL],
            parallel_tool_calls=False,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    assert [call.function.name for call in response.choices[0].message.tool_calls or []] == [
        "get_weather"
    ]
    calls = engine.requests[0].constraint.tool_calls  # type: ignore[union-attr]
    assert calls is not None and calls.mode == "required" and not calls.parallel
    assert [tool.name for tool in calls.tools] == ["get_weather"]


def test_json_schema_response_format_reaches_the_request_and_ignored_fields_are_accepted(
    tmp_path: Path,
):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    with scripted_server(tmp_path, ['{"city": "Paris"}']) as (sdk, _, engine):
        response = sdk.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Which city?"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": schema, "strict": True},
            },
            user="someone",
            metadata={"run": "1"},
            store=False,
            service_tier="auto",
            reasoning_effort="low",
            logit_bias={},
            n=1,
            presence_penalty=0.5,
            frequency_penalty=-0.25,
            logprobs=False,
            seed=1,
        )
    assert response.choices[0].message.content == '{"city": "Paris"}'
    text = engine.requests[0].constraint.text  # type: ignore[union-attr]
    assert text is not None and text.schema == schema and text.strict
    # The penalties reach the loop's sampling parameters.
    params = engine.requests[0].params
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.25)


BAD_TOOL_REQUESTS = [
    pytest.param(
        {"tools": [{**WEATHER_TOOL, "function": {"name": "f", "parameters": {"type": "strin"}}}]},
        "invalid_value",
        "tools[0].function.parameters",
        id="parameters-not-a-schema",
    ),
    pytest.param(
        {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
        "invalid_value",
        "tools[0].function.name",
        id="function-name",
    ),
    pytest.param(
        {"tools": [{"type": "custom", "custom": {"name": "x"}}]},
        "invalid_value",
        "tools[0].type",
        id="custom-tool",
    ),
    pytest.param(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": 5}},
            }
        },
        "invalid_value",
        "response_format.json_schema.schema",
        id="schema-not-a-schema",
    ),
    pytest.param(
        {"response_format": {"type": "json_schema"}},
        "invalid_value",
        "response_format",
        id="json-schema-missing",
    ),
    pytest.param(
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
        "invalid_value",
        "tool_choice",
        id="named-choice-not-offered",
    ),
    pytest.param(
        {"tool_choice": "required"}, "invalid_value", "tool_choice", id="required-no-tools"
    ),
    pytest.param(
        {"messages": [{"role": "tool", "tool_call_id": "call_x", "content": "18 C"}]},
        "invalid_value",
        "messages[0].tool_call_id",
        id="tool-result-for-no-call",
    ),
    pytest.param(
        {"frequency_penalty": -2.5}, "invalid_value", "frequency_penalty", id="penalty-below"
    ),
    pytest.param(
        {"frequency_penalty": "0.5"}, "invalid_type", "frequency_penalty", id="penalty-type"
    ),
    pytest.param({"presence_penalty": 3}, "invalid_value", "presence_penalty", id="penalty-range"),
    pytest.param({"logit_bias": {"42": 5}}, "invalid_value", "logit_bias", id="logit-bias"),
    pytest.param({"n": 17}, "invalid_value", "n", id="n-over-the-limit"),
]


@pytest.mark.parametrize(("fields", "code", "param"), BAD_TOOL_REQUESTS)
def test_bad_tool_and_format_fields_get_a_400_naming_the_field(
    tmp_path: Path, fields: dict[str, Any], code: str, param: str
):
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], **fields}
    with scripted_server(tmp_path, ["ok"]) as (_, raw, _):
        response = raw.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert len(error["message"]) > 30


def test_tools_on_a_template_without_tools_get_a_400_and_tool_choice_none_passes(tmp_path: Path):
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [WEATHER_TOOL],
    }
    with scripted_server(tmp_path, ["ok"], model=ScriptedByteModel) as (_, raw, _):
        refused = raw.post("/v1/chat/completions", json=body)
        answered = raw.post("/v1/chat/completions", json={**body, "tool_choice": "none"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"
    assert "does not show tools" in refused.json()["error"]["message"]
    assert answered.status_code == 200
    assert answered.json()["choices"][0]["message"]["content"] == "ok"


def test_the_openai_agents_sdk_runs_a_tool_task_over_the_socket(tmp_path: Path):
    agents = pytest.importorskip("agents", reason="openai-agents is in the test extra")
    asked: list[str] = []

    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return "18 C, sunny"

    async def run(path: Path) -> tuple[str, str]:
        client = openai.AsyncOpenAI(
            api_key="unused",
            base_url="http://draftpen/v1",
            http_client=httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(path))),
            max_retries=0,
        )
        agent = agents.Agent(
            name="weather",
            instructions="Answer with the weather tool.",
            tools=[agents.function_tool(get_weather)],
            model=agents.OpenAIChatCompletionsModel(model="scripted", openai_client=client),
        )
        whole = await agents.Runner.run(agent, "Weather in Paris?", max_turns=3)
        streamed = agents.Runner.run_streamed(agent, "Weather in Paris?", max_turns=3)
        async for _ in streamed.stream_events():
            pass
        return whole.final_output, streamed.final_output

    agents.set_tracing_disabled(True)
    with scripted_server(tmp_path, [PARIS_CALL, ANSWER]):
        outputs = asyncio.run(run(tmp_path / "tools.sock"))
    assert outputs == (ANSWER, ANSWER)
    assert asked == ["Paris", "Paris"]
