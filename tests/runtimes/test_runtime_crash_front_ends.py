"""A runtime crash as each front end shows it: ``launch`` tells the user while the agent
runs, the plain chat and the chat app keep each partial reply, restart once, then stop
saying why.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.chats.history import INTERRUPTED, History
from app.cli.repl import CRASHED_NOTE, PlainChat
from app.main import build_parser
from app.options import chat_settings
from app.settings import Settings
from app.tui.app import DraftpenApp
from tests.runtimes.crashing_engine import (
    CRASH_ON_DECODE,
    LONG_REPLY,
    PAIR,
    fresh_front_end,  # noqa: F401  (a fixture)
)
from tests.support.draftpen_cli import REPO
from tests.support.engine_process import short_socket
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.real_engine_app import COUNT_PROMPT, StartedEngines, replies, wait_for
from tests.support.tui_helpers import FakeModelsService, run, send

# An agent CLI stand-in for launch: it reads the settings launch gives opencode, streams
# one chat completion, and says how that ended; then it lingers, as an agent would.
FAKE_OPENCODE = """#!{python}
import json, os, sys, time
import httpx
config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
options = config["provider"]["draftpen"]["options"]
body = {{
    "model": config["model"].split("/", 1)[1],
    "messages": [{{"role": "user", "content": {prompt!r}}}],
    "max_tokens": {tokens}, "temperature": 0, "stream": True,
}}
headers = {{"Authorization": "Bearer " + options["apiKey"]}}
url = options["baseURL"] + "/chat/completions"
try:
    with httpx.stream("POST", url, json=body, headers=headers, timeout=300) as answer:
        for _ in answer.iter_lines():
            pass
    print("fake agent: the reply finished", flush=True)
except httpx.HTTPError as error:
    print("fake agent: connection lost:", type(error).__name__, flush=True)
time.sleep(5)
print("fake agent: exiting", flush=True)
sys.exit(1)
"""


@pytest.mark.real_model
def test_launch_tells_the_user_the_engine_crashed_while_the_agent_ran(
    engine_home: Path, tmp_path: Path
) -> None:
    require_model(SMOLLM2_KEY)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cli = bin_dir / "opencode"
    cli.write_text(
        FAKE_OPENCODE.format(python=sys.executable, prompt=COUNT_PROMPT, tokens=LONG_REPLY)
    )
    cli.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "DRAFTPEN_TEST_CRASH": CRASH_ON_DECODE,
        "DRAFTPEN_SOCKET": str(short_socket("launch-crash")),
    }
    env.pop("DRAFTPEN_API_KEY", None)
    result = subprocess.run(
        [sys.executable, "-m", "app.main", "launch", "opencode", "--pair", PAIR],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream: the order says when launch spoke
        text=True,
        timeout=600,
    )
    out = result.stdout
    assert result.returncode == 1, out[-3000:]  # the CLI's own status
    assert "fake agent: connection lost" in out, out[-3000:]
    assert "Traceback" not in out
    # While the agent still ran: the signal, the pair, the fix.
    said = out.index("The llama.cpp runtime crashed (SIGSEGV")
    line = out[said:].splitlines()[0]
    assert f"while generating with pair '{PAIR}'" in line and "draftpen doctor" in line
    assert "opencode cannot reach it until you launch it again" in line
    assert said < out.index("fake agent: exiting")
    # And once more after it, where a full-screen CLI cannot have drawn over it.
    last = out.strip().splitlines()[-1]
    assert last.startswith("draftpen launch: the engine went away during this session: ")
    assert "runtime crashed (SIGSEGV" in last


@pytest.mark.real_model
def test_plain_chat_keeps_each_partial_reply_restarts_once_then_stops_saying_why(
    socket_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    engine_starts: list[int],
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", CRASH_ON_DECODE)
    monkeypatch.setenv("DRAFTPEN_SOCKET", str(socket_path))
    args = build_parser().parse_args(
        [
            "chat",
            "--plain",
            "--pair",
            PAIR,
            "--temperature",
            "0",
            "--drafter",
            "none",
            "--max-tokens",
            str(LONG_REPLY),
        ]
    )
    # Typed ahead: each line is read once the reply before it has ended. A new chat for
    # the second count: after its own cut-off count the model answers briefly.
    typed = f"{COUNT_PROMPT}\n/new\n{COUNT_PROMPT}\n/exit\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    chat = PlainChat(args, chat_settings(args))
    assert chat.run() == 1  # the second crash ends the chat instead of a third engine
    out, err = capsys.readouterr()
    assert err.count(CRASHED_NOTE) == 2
    assert err.count("The llama.cpp runtime crashed (SIGSEGV") == 2
    assert err.count("What it wrote is kept in the chat.") == 2
    assert err.count("starting the engine again") == 1
    assert "crashed twice, so draftpen does not start it again" in err
    assert len(engine_starts) == 2
    # Both counts were on the screen as far as they went (each after a "> " prompt, over
    # as many lines as the model wrote before the crash), and the chat holds the second.
    shown = re.split(r"^> ", out, flags=re.MULTILINE)[1:]
    counts = [text for text in shown if text.strip()]
    assert len(counts) == 2
    assert [message.role for message in chat.messages] == ["user", "assistant"]
    assert chat.messages[1].content.strip()
    assert counts[1].startswith(chat.messages[1].content)


@pytest.mark.real_model
def test_the_chat_app_keeps_the_reply_as_interrupted_restarts_once_then_stops_saying_why(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine_starts: list[int]
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", CRASH_ON_DECODE)
    engines = StartedEngines(socket_path)
    settings = Settings(default_pair=PAIR, temperature=0.0, max_tokens=LONG_REPLY, drafter="none")
    app = DraftpenApp(
        connect=engines.connect,
        models_service=FakeModelsService,
        history=History(tmp_path / "history.sqlite3"),
        settings=settings,
        pair_name=PAIR,
    )

    def notices() -> list[tuple[str, str]]:
        return [(str(n.title), n.message) for n in app._notifications]

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready, "the pair to load", 180)

            # The first crash: the reply is kept, marked, said; the engine starts again.
            await send(pilot, COUNT_PROMPT)
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the crash", 120)
            crashed = replies(app)[-1]
            assert "interrupted: the runtime crashed" in str(crashed.query_one(".heading").render())
            stored = app.history.messages(app.chat_screen.chat_id)
            assert stored[-1].state == INTERRUPTED
            assert stored[-1].content.strip() and stored[-1].content == crashed.content
            [text] = [text for title, text in notices() if title == "The runtime crashed mid-reply"]
            assert "(SIGSEGV" in text and f"pair '{PAIR}'" in text and "draftpen doctor" in text
            await wait_for(pilot, lambda: app.ready, "the one restart", 180)
            assert len(engine_starts) == 2

            # The second crash (in a new chat: after its own cut-off count the model
            # answers briefly): kept the same way, and the app stops, saying why.
            first_chat = app.chat_screen.chat_id
            await pilot.press("ctrl+n")
            await send(pilot, COUNT_PROMPT)
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the crash", 120)
            await app.workers.wait_for_complete()
            for chat_id in (first_chat, app.chat_screen.chat_id):
                stored = app.history.messages(chat_id)
                assert [m.state for m in stored if m.role == "assistant"] == [INTERRUPTED]
            assert stored[-1].content.strip() and stored[-1].content == replies(app)[-1].content
            assert not app.ready and "crashed twice" in app.engine_status
            assert "draftpen doctor" in app.engine_status

            # Sending or loading again starts nothing: the app repeats why.
            await send(pilot, "Name three colours.")
            app.load_pair(PAIR)
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert "crashed twice" in app.engine_status and not app.ready
            assert len(engine_starts) == 2

    run(body)


@pytest.mark.real_model
def test_the_chat_app_whose_engine_crashes_loading_retries_once_then_says_why(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine_starts: list[int]
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "load:SIGSEGV")
    engines = StartedEngines(socket_path)
    app = DraftpenApp(
        connect=engines.connect,
        models_service=FakeModelsService,
        history=History(tmp_path / "history.sqlite3"),
        settings=Settings(default_pair=PAIR),
        pair_name=PAIR,
    )

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: "Cannot load" in app.engine_status, "the failure", 180)
            await app.workers.wait_for_complete()
            status = app.engine_status
            assert f"while loading pair '{PAIR}'" in status and "(SIGSEGV" in status
            assert "crashed twice" in status and "draftpen doctor" in status
            assert len(engine_starts) == 2 and not app.ready

    run(body)
