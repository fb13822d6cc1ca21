"""The Responses API on the real starter pair (Qwen2.5-Coder 1.5B + 0.5B).

One ``draftpen serve --pair starter --context 32768`` for the module, on its Unix
socket and on TCP with an API key, as ``draftpen launch codex`` runs it: the official
``openai`` SDK generates through both. The shapes themselves are checked on scripted
models in tests/engine/test_openai_responses.py; Codex CLI itself answers through
``draftpen launch codex`` in tests/agents/test_agent_clis.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.engine.responses_helpers import WEATHER, free_port
from tests.support.model_files import DRAFT_KEY, TARGET_KEY, require_model
from tests.support.serve_process import RunningServer, start_server

API_KEY = "responses-real-test-key"
# Codex's prompt (instructions and tool schemas) is about 9k tokens; its answer, more.
CONTEXT = 32768


class StarterServer:
    """The module's server and the SDK on its socket and on TCP."""

    def __init__(self, running: RunningServer, port: int) -> None:
        self.running = running
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def tcp(self) -> openai.OpenAI:
        """The SDK on TCP, with the key."""
        return openai.OpenAI(
            api_key=API_KEY,
            base_url=self.base_url,
            max_retries=0,
            http_client=httpx.Client(timeout=600),
        )

    def socket(self) -> openai.OpenAI:
        """The SDK on the Unix socket (no key needed there)."""
        return self.running.openai()


@pytest.fixture(scope="module")
def starter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StarterServer]:
    """``draftpen serve --pair starter --context 32768`` on a socket and on TCP."""
    require_model(TARGET_KEY)
    require_model(DRAFT_KEY)
    home = tmp_path_factory.mktemp("responses-home")
    port = free_port()
    running = start_server(
        home,
        home / "responses.sock",
        "--context",
        str(CONTEXT),
        "--tcp",
        f"127.0.0.1:{port}",
        "--api-key",
        API_KEY,
        pair="starter",
    )
    yield StarterServer(running, port)
    running.stop()


def ask(sdk: openai.OpenAI, **fields: Any) -> Any:
    """A greedy, short Responses request to the starter pair."""
    return sdk.responses.create(
        model="starter", **{"temperature": 0, "max_output_tokens": 40, **fields}
    )


@pytest.mark.real_model
def test_starter_answers_over_tcp_and_the_socket_streamed_and_not(starter: StarterServer):
    question = "What is 2+3? Answer with the number only."
    # One fixed drafter for both: auto's K follows what earlier requests taught it, and
    # under the default (fastest) kernels another verify batch may flip a near-tie.
    fixed = {"speculative": {"drafter": "model", "k": 4}}
    whole = ask(starter.tcp(), input=question, extra_body=fixed)
    assert whole.status == "completed" and "5" in whole.output_text
    assert whole.usage is not None and whole.usage.output_tokens > 0
    events = list(ask(starter.socket(), input=question, stream=True, extra_body=fixed))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    # Greedy decoding on the same path: the same answer streamed and whole.
    assert deltas == events[-1].response.output_text == whole.output_text


@pytest.mark.real_model
@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "name": "get_weather"}],
    ids=["required", "named"],
)
def test_starter_must_call_when_the_tool_choice_says_so(starter: StarterServer, tool_choice: Any):
    # A question no tool answers: only the grammar makes the call certain.
    response = ask(
        starter.tcp(),
        input="Tell me a short joke about cats.",
        tools=[WEATHER],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
    )
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert (response.model_extra or {})["draftpen"]["grammar_forced"] > 0


@pytest.mark.real_model
def test_starter_tool_loop_with_function_call_output(starter: StarterServer):
    sdk = starter.tcp()
    system = (
        "You are a weather assistant. Call a tool when you need data; when a tool result "
        "is there, answer the user in one sentence."
    )
    first = ask(sdk, instructions=system, input="What is the weather in Paris?", tools=[WEATHER])
    [call] = [item for item in first.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Paris"}
    second = ask(
        sdk,
        instructions=system,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}],
        tools=[WEATHER],
    )
    assert second.status == "completed"
    assert [item.type for item in second.output] == ["message"]
    assert "18" in second.output_text
    # The second turn begins with the first's prompt and reply: the engine held them.
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0


@pytest.mark.real_model
def test_starter_json_schema_text_format_gives_valid_json(starter: StarterServer):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "license": {"enum": ["MIT", "Apache-2.0", "BSD-3-Clause"]},
        },
        "required": ["name", "license"],
        "additionalProperties": False,
    }
    response = ask(
        starter.socket(),
        input="Describe the requests package.",
        text={
            "format": {"type": "json_schema", "name": "package", "schema": schema, "strict": True}
        },
        max_output_tokens=80,
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), schema)
