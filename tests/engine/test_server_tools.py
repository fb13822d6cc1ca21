"""Tools and structured-output fields over the socket, with the official ``openai`` SDK.

A scripted byte model (tests/byte_model.py) with a Hermes-style Jinja template writes
exactly the replies a test needs, so the tool loop, parallel calls and the stream's
shape are checked in-process in milliseconds; the last tests do the same on the real
starter pair (Qwen2.5-Coder, whose own template takes tools).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.engine.runner import AgentServer
from app.settings import Settings
from backends.base import ChatMessage, ToolSpec
from backends.output.chat_template import render_chat
from backends.output.output_constraints import ConstraintSpec
from tests.engine.test_server import RunningServer, start_starter_server
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
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
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


# -- the real starter pair (Qwen2.5-Coder 1.5B + 0.5B) -----------------------------------

WEATHER_SYSTEM = (
    "You are a weather assistant. Call a tool when you need data; when a tool response "
    "is there, answer the user in one sentence."
)


@pytest.fixture(scope="module")
def starter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """``draftpen serve --pair starter`` on a socket."""
    yield from start_starter_server(tmp_path_factory, "starter-home")


def weather_turn(server: RunningServer, messages: list[dict[str, Any]], **fields: Any) -> Any:
    return server.openai().chat.completions.create(
        model="starter",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        temperature=0,
        max_tokens=40,
        **fields,
    )


@pytest.mark.real_model
def test_starter_runs_a_two_turn_tool_loop_streamed_and_not(starter: RunningServer):
    question = [
        {"role": "system", "content": WEATHER_SYSTEM},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    first = weather_turn(starter, question)
    streamed = list(weather_turn(starter, question, stream=True))
    assert without_ids(reassemble(streamed)) == without_ids(flat(first))

    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content

    conversation = [
        *question,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
    ]
    final = reassemble(list(weather_turn(starter, conversation, stream=True)))
    assert final["finish_reason"] == "stop" and final["tool_calls"] is None
    assert final["content"] and "18" in final["content"]


@pytest.mark.real_model
def test_starter_refuses_a_malformed_response_format_schema(starter: RunningServer):
    with pytest.raises(openai.BadRequestError, match="not a valid JSON Schema"):
        starter.openai().chat.completions.create(
            model="starter",
            messages=[{"role": "user", "content": "hi"}],
            response_format={  # type: ignore[typeddict-item]
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "required": "city"}},
            },
        )


@pytest.mark.real_model
@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_starter_must_call_when_the_tool_choice_says_so(starter: RunningServer, tool_choice):
    import jsonschema

    # A question no tool answers: only the grammar makes the call certain.
    question = [{"role": "user", "content": "Tell me a short joke about cats."}]
    # One call: left free to call in parallel, the 1.5B model repeats its call.
    response = weather_turn(starter, question, tool_choice=tool_choice, parallel_tool_calls=False)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
    usage = response.model_extra or {}
    assert usage["draftpen"]["grammar_forced"] > 0


FORECAST_TOOL = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "description": "The weather forecast for a city over the next days",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "units": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "days", "units"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.real_model
def test_starter_auto_calls_follow_the_schema_and_plain_questions_get_text(
    starter: RunningServer,
):
    import jsonschema

    def ask(question: str) -> Any:
        return starter.openai().chat.completions.create(
            model="starter",
            messages=[
                {"role": "system", "content": WEATHER_SYSTEM},
                {"role": "user", "content": question},
            ],
            tools=[FORECAST_TOOL],  # type: ignore[list-item]
            tool_choice="auto",
            temperature=0,
            max_tokens=80,
        )

    called = ask("What will the weather be in Oslo over the next 3 days, in celsius?")
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_forecast"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, FORECAST_TOOL["function"]["parameters"])
    assert arguments["city"] == "Oslo"
    # The lazy grammar took over once <tool_call> was written: the wrapper, the keys
    # and the function's name were forced.
    assert (called.model_extra or {})["draftpen"]["grammar_forced"] > 0

    answered = ask("Say hello in French, in one short sentence. No tools needed.")
    choice = answered.choices[0]
    assert choice.finish_reason == "stop", choice
    assert not choice.message.tool_calls
    assert choice.message.content and "<tool_call>" not in choice.message.content


JSON_SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "package": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+$"},
                },
                "required": ["name", "version"],
                "additionalProperties": False,
            },
            "license": {"enum": ["MIT", "Apache-2.0", "BSD-3-Clause"]},
        },
        "required": ["package", "license"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "items": {"type": "string", "maxLength": 30},
                "minItems": 2,
                "maxItems": 3,
            },
            "done": {"type": "boolean"},
        },
        "required": ["steps", "done"],
        "additionalProperties": False,
    },
}


@pytest.mark.real_model
@pytest.mark.parametrize("name", sorted(JSON_SCHEMAS))
def test_starter_json_schema_replies_validate(starter: RunningServer, name: str):
    import jsonschema

    schema = JSON_SCHEMAS[name]
    response = starter.openai().chat.completions.create(
        model="starter",
        messages=[{"role": "user", "content": "Describe installing the requests package."}],
        response_format={  # type: ignore[typeddict-item]
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True},
        },
        temperature=0,
        max_tokens=200,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content or ""), schema)
