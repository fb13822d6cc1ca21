"""What agents such as Claude Code send to the Messages API: count_tokens, their extra
fields and headers, the key over TCP, and system turns in the middle of a conversation.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest

from tests.engine.messages_server import (
    API_KEY,
    QUESTION,
    WEATHER_TOOL,
    blocks,
    create,
    messages_server,
)
from tests.support.scripted_tools import ANSWER, prompt_text

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
