"""`chat --plain` whose engine's runtime process dies mid-reply: it says "the engine's
runtime restarted" and why, keeps the partial reply, and goes on with the same engine.

The engine is a real one in this process whose runtime is a real spawned process over
scripted models (tests/support/runtime_process.py); the test kills that process.
"""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import pytest

from app.cli.repl import RESTARTED_NOTE, PlainChat
from app.main import build_parser
from app.options import chat_settings
from tests.support.engine_fixtures import wait_until
from tests.support.runtime_process import LONG_REPLY, ScriptedRuntime, runtime_engine


def test_plain_chat_keeps_the_partial_reply_and_goes_on_when_the_runtime_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = ScriptedRuntime(token_seconds=0.05)
    with runtime_engine(tmp_path, setup, preload="alpha") as engine:
        monkeypatch.setenv("DRAFTPEN_SOCKET", str(engine.socket_path))
        client = engine.client()
        killed: list[int] = []

        def kill_mid_reply() -> None:
            # Once the first reply is being written, and has written a little.
            wait_until(lambda: client.health().queue.running_count == 1, "the reply", 60)
            wait_until(lambda: capsys_text() != "", "the reply's first words", 60)
            killed.append(engine.runtime_pid())
            os.kill(killed[0], signal.SIGKILL)

        out_so_far: list[str] = []
        err_so_far: list[str] = []

        def capsys_text() -> str:
            captured = capsys.readouterr()
            out_so_far.append(captured.out)
            err_so_far.append(captured.err)
            return "".join(out_so_far).partition("> ")[2].strip()

        killer = threading.Thread(target=kill_mid_reply, daemon=True)
        args = build_parser().parse_args(
            ["chat", "--plain", "--pair", "alpha", "--temperature", "0"]
        )
        monkeypatch.setattr("sys.stdin", io.StringIO("Write the reply.\nAgain, please.\n/exit\n"))
        chat = PlainChat(args, chat_settings(args))
        killer.start()
        assert chat.run() == 0
        killer.join(10)
        runtime = client.health().runtime
    captured = capsys.readouterr()
    out = "".join(out_so_far) + captured.out
    err = "".join(err_so_far) + captured.err
    assert killed, "the runtime was killed mid-reply"
    assert RESTARTED_NOTE in err
    assert f"the engine's runtime restarted: its process (pid {killed[0]}) was killed" in err
    assert "What it wrote is kept in the chat." in err
    assert "starting the engine again" not in err
    # The first reply as far as it went, then the second one whole, from the new runtime.
    roles = [message.role for message in chat.messages]
    assert roles == ["user", "assistant", "user", "assistant"]
    partial, whole = chat.messages[1].content, chat.messages[3].content
    assert partial and LONG_REPLY.startswith(partial) and partial != LONG_REPLY
    assert whole == LONG_REPLY
    assert partial in out
    assert runtime is not None and runtime.restarts == 1
