"""``reasoning_content`` over the socket: a model that thinks, streamed and not.

The model is :class:`~tests.support.thinking_model.ThinkingByteModel` (Qwen3's own template over
scripted replies; no small thinking model can be had from PyPI), served in-process by the
real server on a real Unix socket, read with httpx and the ``openai`` SDK.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.support.scripted_tools import PARIS_CALL, WEATHER_TOOL, prompt_text, scripted_server
from tests.support.thinking_model import ThinkingByteModel, thinking_reply

REASONING = "The user wants the weather.\nI should answer briefly."
ANSWER = "It is sunny in Paris."
REPLY = thinking_reply(REASONING, ANSWER)
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


def _chat(raw: httpx.Client, **fields: Any) -> httpx.Response:
    return raw.post("/v1/chat/completions", json={"model": "scripted", **fields})


def _stream(raw: httpx.Client, **fields: Any) -> list[dict[str, Any]]:
    body = {"model": "scripted", "stream": True, "stream_options": {"include_usage": True}}
    with raw.stream("POST", "/v1/chat/completions", json={**body, **fields}) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_reasoning_comes_back_apart_from_the_answer(tmp_path: Path) -> None:
    with scripted_server(tmp_path, [REPLY], ThinkingByteModel) as (_, raw, _engine):
        response = _chat(raw, messages=QUESTION, temperature=0)
        assert response.status_code == 200, response.text
        body = response.json()
        message = body["choices"][0]["message"]
        assert message["content"] == ANSWER
        assert message["reasoning_content"] == REASONING
        usage = body["usage"]
        reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"]
        # The reasoning's characters and tags are one byte token each.
        assert reasoning_tokens == len(f"<think>\n{REASONING}\n</think>")
        assert usage["completion_tokens"] > reasoning_tokens


def test_a_stream_sends_reasoning_in_reasoning_content_deltas(tmp_path: Path) -> None:
    with scripted_server(tmp_path, [REPLY], ThinkingByteModel) as (_, raw, _engine):
        chunks = _stream(raw, messages=QUESTION, temperature=0)
        deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
        assert deltas[0]["role"] == "assistant"
        reasoning = "".join(delta.get("reasoning_content") or "" for delta in deltas)
        content = "".join(delta.get("content") or "" for delta in deltas)
        assert reasoning == REASONING
        assert content == ANSWER
        # No delta carries both, and the tags reach neither.
        assert not any(delta.get("content") and delta.get("reasoning_content") for delta in deltas)
        assert "think>" not in reasoning + content
        usage = chunks[-1]["usage"]
        reasoning_tokens = len(f"<think>\n{REASONING}\n</think>")
        assert usage["completion_tokens_details"]["reasoning_tokens"] == reasoning_tokens
        # The running stats count them as they come: up to the total, never down.
        running = [chunk["draftpen"]["reasoning_tokens"] for chunk in chunks if chunk["choices"]]
        assert running == sorted(running) and running[-1] == reasoning_tokens
        assert running[0] < reasoning_tokens


def test_the_openai_sdk_reads_reasoning_content(tmp_path: Path) -> None:
    with scripted_server(tmp_path, [REPLY], ThinkingByteModel) as (sdk, _, _engine):
        response = sdk.chat.completions.create(model="scripted", messages=QUESTION)  # type: ignore[arg-type]
        message = response.choices[0].message
        assert message.content == ANSWER
        assert getattr(message, "reasoning_content", None) == REASONING


def test_thinking_turns_off_through_the_template_switch(tmp_path: Path) -> None:
    with scripted_server(tmp_path, [REPLY], ThinkingByteModel) as (_, raw, engine):
        for fields in (
            {"chat_template_kwargs": {"enable_thinking": False}},
            {"reasoning_effort": "none"},
        ):
            body = _chat(raw, messages=QUESTION, **fields).json()
            message = body["choices"][0]["message"]
            assert message["content"] == ANSWER
            assert "reasoning_content" not in message
            assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
            assert prompt_text(engine, -1).endswith("<think>\n\n</think>\n\n")
        # reasoning_effort "high" and enable_thinking true leave the template's default.
        body = _chat(raw, messages=QUESTION, reasoning_effort="high").json()
        assert body["choices"][0]["message"]["reasoning_content"] == REASONING


def test_bad_thinking_fields_get_a_400_naming_them(tmp_path: Path) -> None:
    with scripted_server(tmp_path, [REPLY], ThinkingByteModel) as (_, raw, _engine):
        response = _chat(raw, messages=QUESTION, chat_template_kwargs={"add_vision_id": True})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "chat_template_kwargs.add_vision_id"
        response = _chat(raw, messages=QUESTION, reasoning_effort="extreme")
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "reasoning_effort"


def test_earlier_reasoning_is_accepted_back_and_never_shown_to_the_model(tmp_path: Path) -> None:
    with scripted_server(tmp_path, [REPLY, REPLY], ThinkingByteModel) as (_, raw, engine):
        first = _chat(raw, messages=QUESTION).json()["choices"][0]["message"]
        conversation = [*QUESTION, first, {"role": "user", "content": "And tomorrow?"}]
        response = _chat(raw, messages=conversation)
        assert response.status_code == 200, response.text
        prompt = prompt_text(engine, -1)
        assert ANSWER in prompt
        assert "I should answer briefly" not in prompt


def test_tool_calls_are_read_from_the_answer_only(tmp_path: Path) -> None:
    thinking_about_a_call = thinking_reply(f"Maybe {PARIS_CALL} would do.", PARIS_CALL)
    with scripted_server(tmp_path, [thinking_about_a_call], ThinkingByteModel) as (_, raw, _e):
        body = _chat(raw, messages=QUESTION, tools=[WEATHER_TOOL]).json()
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        [call] = choice["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        assert choice["message"]["reasoning_content"] == f"Maybe {PARIS_CALL} would do."
        chunks = _stream(raw, messages=QUESTION, tools=[WEATHER_TOOL])
        deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
        calls = [call for delta in deltas for call in delta.get("tool_calls") or ()]
        assert [call["function"].get("name") for call in calls if "id" in call] == ["get_weather"]
        reasoning = "".join(delta.get("reasoning_content") or "" for delta in deltas)
        assert reasoning == f"Maybe {PARIS_CALL} would do."
