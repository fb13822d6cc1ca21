"""Issue 41 on scripted models: every dialect, streamed and not, shows no call syntax as
text and runs no call twice.

A scripted byte model behind a Hermes template (tests/support/scripted_tools.py) writes
exactly the replies that showed the defect: the same forced call again and again, and
a reply cut by ``max_tokens`` in the head of its next call. The same conversation goes
through Anthropic Messages, OpenAI chat completions and Responses
(tests/engine/tool_call_dialects.py); the real starter pair's reply is checked in
tests/engine/test_forced_write_real.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.messages_server import WEATHER_TOOL
from tests.engine.tool_call_dialects import DIALECTS, ask, assert_no_call_markup
from tests.support.scripted_tools import scripted_server

PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ROME = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
# How each dialect says "the reply called tools" and "the reply was cut off".
CALLED = {"messages": "tool_use", "chat": "tool_calls", "responses": "completed"}
CUT_OFF = {"messages": "max_tokens", "chat": "length", "responses": "incomplete"}
STREAMED = [False, True]


def conversation(**fields: Any) -> dict[str, Any]:
    """A Messages request with the weather tool, greedy, no drafting."""
    return {
        "model": "scripted",
        "max_tokens": 400,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        **fields,
    }


FORCED = {"type": "tool", "name": "get_weather"}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_forced_call_repeated_until_the_limit_becomes_one_call(tmp_path: Path, dialect: str):
    with scripted_server(tmp_path, [f"{PARIS}\n{PARIS}\n{PARIS}\n{PARIS}"]) as (_, raw, engine):
        for stream in STREAMED:
            reply = ask(raw, dialect, conversation(tool_choice=FORCED), stream=stream)
            assert not "".join(reply.texts), (stream, reply)
            assert reply.calls == [("get_weather", {"city": "Paris"})], stream
            assert reply.stop == CALLED[dialect]
            assert reply.stats["stopped_at_repeated_call"] is True
    # The loop stopped at the repeat instead of writing all four calls.
    assert all(event.repeated_call for event in engine.events if event.finish_reason)
    assert sum(len(event.tokens) for event in engine.events) < 2 * 3 * len(PARIS)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_text_then_a_repeated_call_keeps_the_text_and_one_call(tmp_path: Path, dialect: str):
    with scripted_server(tmp_path, [f"Checking.\n{PARIS}\n{PARIS}\nDone."]) as (_, raw, _):
        for stream in STREAMED:
            reply = ask(raw, dialect, conversation(), stream=stream)
            assert reply.texts == ["Checking."], stream
            assert reply.calls == [("get_weather", {"city": "Paris"})]
            assert reply.stop == CALLED[dialect]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_reply_cut_off_in_its_next_calls_head_shows_no_markup(tmp_path: Path, dialect: str):
    # Issue 41's first text block: '\n<tool_call>\n{"name": "', a call max_tokens cut.
    for cut in (
        '\n<tool_call>\n{"name": "',
        "\n<tool_c",
        '\n<tool_call>\n{"name": "get_weather", "arg',
    ):
        limit = len(PARIS) + len(cut)  # a byte a token
        with scripted_server(tmp_path, [f"{PARIS}\n{ROME}"]) as (_, raw, _):
            for stream in STREAMED:
                request = conversation(tool_choice=FORCED, max_tokens=limit)
                reply = ask(raw, dialect, request, stream=stream)
                assert_no_call_markup(reply)
                assert not "".join(reply.texts), (cut, stream, reply)
                assert reply.calls == [("get_weather", {"city": "Paris"})]
                assert reply.stop == CUT_OFF[dialect]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_parallel_calls_off_is_one_call_by_the_grammar(tmp_path: Path, dialect: str):
    forced_once = {**FORCED, "disable_parallel_tool_use": True}
    with scripted_server(tmp_path, [f"{PARIS}\n{ROME}"]) as (_, raw, engine):
        for stream in STREAMED:
            reply = ask(raw, dialect, conversation(tool_choice=forced_once), stream=stream)
            assert not "".join(reply.texts)
            assert reply.calls == [("get_weather", {"city": "Paris"})]
            assert reply.stop == CALLED[dialect]
            assert "stopped_at_repeated_call" not in reply.stats
    # The grammar ended the reply: the second call was never written.
    assert "Rome" not in "".join(event.text for event in engine.events)
    assert all(request.constraint.tool_calls.parallel is False for request in engine.requests)  # type: ignore[union-attr]
