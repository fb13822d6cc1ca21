"""When a chat outgrows the context, the engine leaves out its oldest turns and says so.

The engine reports how many messages it left out (``draftpen.left_out_messages``); the
client's stream exposes the count; the plain REPL prints a line and the chat app shows
a notice. The real engine server (uvicorn on a Unix socket, the queue, the scheduler)
runs in this process over scripted byte-level models with a small context, so what was
left out can be read back from the prompt the engine actually built.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from app.cli.repl import PlainChat
from app.client import ChatTurn
from app.main import build_parser
from app.options import chat_settings
from app.settings import Settings
from backends.base import ChatMessage
from backends.engine import Engine
from backends.sampling.filters import SamplingParams
from tests.support.byte_model import BYTE_OFFSET
from tests.support.engine_fixtures import scripted_engine_server
from tests.support.tui_helpers import (
    make_app,
    run,
    scripted_engine,
    send,
    settle,
    stop_engine_servers,  # noqa: F401 (an autouse fixture)
)

GREEDY = SamplingParams(temperature=0.0)
LONG = " ".join(["word"] * 30)  # ~150 byte tokens: a few such turns outgrow 512


def prompt_text(engine: Engine, index: int = -1) -> str:
    """The text of the prompt the engine generated from (byte tokens only)."""
    request = engine.requests[index]  # type: ignore[attr-defined]
    data = bytes(token - BYTE_OFFSET for token in request.prompt_tokens if token >= BYTE_OFFSET)
    return data.decode()


def messages_left_out(prompt: str, user_texts: list[str]) -> int:
    """How many messages of a user/assistant alternation are missing from ``prompt``:
    each user turn that is gone took its reply with it."""
    return sum(2 for text in user_texts if text.strip() not in prompt)


def test_the_stream_says_how_many_of_the_oldest_messages_were_left_out(tmp_path: Path):
    users = [f"turn {index}: {LONG}" for index in range(6)]
    messages: list[ChatMessage] = []
    for text in users:
        messages += [ChatMessage("user", text), ChatMessage("assistant", "ok")]
    messages.append(ChatMessage("user", "And now?"))
    with scripted_engine_server(tmp_path, n_ctx=512) as engine:
        client = engine.client()
        stream = client.chat(ChatTurn("alpha", tuple(messages), GREEDY, max_tokens=64))
        assert list(stream)
        prompt = prompt_text(engine.engines[0])
        left_out = messages_left_out(prompt, users)
        assert left_out >= 2 and prompt.endswith("And now?")
        assert stream.left_out_messages == left_out

        # A chat that fits: nothing is left out, and nothing is said.
        short = client.chat(ChatTurn("alpha", (ChatMessage("user", "Hi"),), GREEDY, max_tokens=64))
        assert list(short) and short.left_out_messages == 0


def test_the_plain_chat_prints_how_many_turns_it_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    users = [f"turn {index}: {LONG}" for index in range(5)]
    with scripted_engine_server(tmp_path, n_ctx=512) as engine:
        monkeypatch.setenv("DRAFTPEN_SOCKET", str(engine.socket_path))
        args = build_parser().parse_args(
            ["chat", "--plain", "--pair", "alpha", "--context", "512", "--max-tokens", "64"]
        )
        monkeypatch.setattr("sys.stdin", io.StringIO("\n".join([*users, "/exit"]) + "\n"))
        chat = PlainChat(args, chat_settings(args))
        assert chat.run() == 0
        scripted = engine.engines[0]
        prompts = [prompt_text(scripted, index) for index in range(len(users))]
    err = capsys.readouterr().err
    said = [int(count) for count in re.findall(r"the (\d+) oldest messages? were left out", err)]
    expected = [messages_left_out(prompt, users[:i]) for i, prompt in enumerate(prompts)]
    assert expected[0] == 0 and expected[-1] >= 2  # the chat did outgrow the context
    assert said == [count for count in expected if count]
    # The REPL's own conversation keeps every turn: only the prompt left them out.
    assert [m.content for m in chat.messages if m.role == "user"] == users


def test_the_chat_app_shows_a_notice_when_the_oldest_turns_are_left_out() -> None:
    engine = scripted_engine(["ok"], n_ctx=512)
    settings = Settings(default_pair="fake", drafter="ngram", temperature=0.0, max_tokens=64)
    app = make_app({"fake": engine}, settings=settings)
    users = [f"turn {index}: {LONG}" for index in range(5)]

    def notices() -> list[str]:
        return [n.message for n in app._notifications if "oldest" in n.message]

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            counts: list[int] = []
            for index, text in enumerate(users):
                await send(pilot, text)
                await settle(app, pilot)
                counts.append(messages_left_out(prompt_text(engine), users[:index]))
            assert counts[0] == 0 and counts[-1] >= 2
            shown = [int(re.findall(r"The (\d+) oldest", notice)[0]) for notice in notices()]
            assert shown == [count for count in counts if count]
            # The history keeps every turn; only the prompt left them out.
            stored = app.history.messages(app.chat_screen.chat_id)
            assert [m.content for m in stored if m.role == "user"] == users

    run(body)
