"""The Responses API as its clients use it: a Codex CLI request with its extra fields, and
the SDK over TCP.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai

from app.engine.runner import AgentServer
from app.settings import Settings
from tests.engine.responses_helpers import (
    QUESTION,
    WEATHER,
    free_port,
)
from tests.support.scripted_tools import (
    PARIS_CALL,
    HermesScriptedModel,
    prompt_text,
    scripted_server,
)
from tests.support.tui_helpers import RecordingEngine


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
