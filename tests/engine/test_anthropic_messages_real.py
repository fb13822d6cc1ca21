"""Anthropic's Messages API on the real starter pair, through the ``anthropic`` SDK.

``draftpen serve --pair starter`` runs as a subprocess on TCP with an API key, as an
agent CLI would reach it. The SDK tests check what generation decides (an answer, a
call the grammar makes certain, a tool result answered); the shapes are checked fast,
on scripted models, in tests/engine/test_anthropic_messages.py. Claude Code itself answers
through ``draftpen launch claude`` in tests/agents/test_agent_clis.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import pytest

from tests.engine.messages_server import API_KEY, WEATHER_TOOL, blocks
from tests.support.model_files import DRAFT_KEY, TARGET_KEY, require_model
from tests.support.serve_process import RunningServer, start_server

# -- the SDK ------------------------------------------------------------------------------

# The SDK (2.x) has no sampling parameters any more; the API still takes them, and so
# does draftpen: greedy answers are what these tests can count on.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def starter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    """``draftpen serve --pair starter --tcp 127.0.0.1:0`` and its TCP base URL."""
    require_model(TARGET_KEY)
    require_model(DRAFT_KEY)
    home = tmp_path_factory.mktemp("anthropic-starter")
    running = start_server(
        home, home / "s.sock", "--tcp", "127.0.0.1:0", "--api-key", API_KEY, pair="starter"
    )
    url = running.health()["tcp"].removesuffix("/v1")
    yield running, url
    running.stop()


def starter_sdk(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=API_KEY, max_retries=0, timeout=600)


@pytest.mark.real_model
def test_starter_answers_through_the_sdk_streamed_and_not(starter: tuple[RunningServer, str]):
    sdk = starter_sdk(starter[1])
    request: dict[str, Any] = {
        "model": "starter",
        "max_tokens": 20,
        "extra_body": GREEDY,
        "system": "Answer with the number only.",
        "messages": [{"role": "user", "content": "What is 2+3?"}],
    }
    whole = sdk.messages.create(**request)
    with sdk.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    counted = sdk.messages.count_tokens(
        model="starter", system=request["system"], messages=request["messages"]
    )
    assert whole.stop_reason == "end_turn"
    [text] = whole.content
    assert text.type == "text" and "5" in text.text
    assert blocks(streamed) == blocks(whole)
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == counted.input_tokens


@pytest.mark.real_model
def test_starter_must_call_the_named_tool_then_answers_its_result(
    starter: tuple[RunningServer, str],
):
    sdk = starter_sdk(starter[1])
    system = (
        "You are a weather assistant. Call a tool when you need data; when a tool result "
        "is there, answer the user in one sentence."
    )
    # A question no tool answers: only the grammar makes the call certain.
    joke = [{"role": "user", "content": "Tell me a short joke about cats."}]
    forced = sdk.messages.create(
        model="starter",
        max_tokens=40,
        extra_body=GREEDY,
        system=system,
        messages=joke,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    assert forced.stop_reason == "tool_use", forced
    [call] = forced.content
    assert call.type == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER_TOOL["input_schema"])

    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = sdk.messages.create(
        model="starter",
        max_tokens=40,
        extra_body=GREEDY,
        system=system,
        messages=question,
        tools=[WEATHER_TOOL],
    )
    [asked] = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and asked.input == {"city": "Paris"}
    conversation = [
        *question,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": asked.id, "content": "18 C, sunny"}],
        },
    ]
    with sdk.messages.stream(
        model="starter",
        max_tokens=60,
        extra_body=GREEDY,
        system=system,
        messages=conversation,
        tools=[WEATHER_TOOL],
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn"
    assert final.content[0].type == "text" and "18" in final.content[0].text
