"""A runtime that dies as each front end sees it: the engine stays and starts its runtime
again, so an agent under ``launch`` goes on with its next turn, and the plain chat and
the chat app keep each partial reply, say "the engine's runtime restarted" and why, and
go on with the same engine (no front end starts another).
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
from app.cli.repl import RESTARTED_NOTE, PlainChat
from app.client import EngineClient
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
from tests.support.engine_process import short_socket, stop_engine
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.real_engine_app import COUNT_PROMPT, StartedEngines, replies, wait_for
from tests.support.tui_helpers import FakeModelsService, run, send

# An agent CLI stand-in for launch: it reads the settings launch gives opencode, has one
# turn, kills the engine's runtime process (as an abort in llama.cpp would end it), and
# has its next turn on the same address, as an agent would.
FAKE_OPENCODE = """#!{python}
import json, os, signal, sys
import httpx
config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
options = config["provider"]["draftpen"]["options"]
headers = {{"Authorization": "Bearer " + options["apiKey"]}}
url = options["baseURL"]

def turn(text):
    body = {{
        "model": config["model"].split("/", 1)[1],
        "messages": [{{"role": "user", "content": text}}],
        "max_tokens": 12, "temperature": 0,
    }}
    answer = httpx.post(url + "/chat/completions", json=body, headers=headers, timeout=300)
    answer.raise_for_status()
    return answer.json()["choices"][0]["message"]["content"]

print("fake agent: turn 1:", repr(turn("Say hello.")), flush=True)
health = httpx.get(url.removesuffix("/v1") + "/health", headers=headers, timeout=30).json()
os.kill(health["runtime"]["pid"], signal.SIGKILL)
print("fake agent: killed the runtime", health["runtime"]["pid"], flush=True)
print("fake agent: turn 2:", repr(turn("Name a colour.")), flush=True)
sys.exit(0)
"""


@pytest.mark.real_model
def test_an_agent_under_launch_goes_on_after_its_runtime_is_killed_between_turns(
    engine_home: Path, tmp_path: Path
) -> None:
    require_model(SMOLLM2_KEY)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cli = bin_dir / "opencode"
    cli.write_text(FAKE_OPENCODE.format(python=sys.executable))
    cli.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "DRAFTPEN_SOCKET": str(short_socket("launch-restart")),
    }
    env.pop("DRAFTPEN_API_KEY", None)
    env.pop("DRAFTPEN_TEST_CRASH", None)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "app.main", "launch", "opencode", "--pair", PAIR],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # one stream: the order says when launch spoke
            text=True,
            timeout=600,
        )
    finally:
        stop_engine(EngineClient(Path(env["DRAFTPEN_SOCKET"])))
    out = result.stdout
    assert result.returncode == 0, out[-3000:]  # the CLI's own status: both turns answered
    assert "Traceback" not in out
    assert "fake agent: killed the runtime" in out
    second = [line for line in out.splitlines() if line.startswith("fake agent: turn 2:")]
    assert second and second[0] != "fake agent: turn 2: ''", out[-3000:]
    assert "the engine went away" not in out


@pytest.mark.real_model
def test_plain_chat_keeps_each_partial_reply_and_goes_on_with_the_same_engine(
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
    # the second count: after its own cut-off count the model answers briefly. Each
    # runtime crashes on its 12th forward pass, so both replies are cut off.
    typed = f"{COUNT_PROMPT}\n/new\n{COUNT_PROMPT}\n/exit\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    chat = PlainChat(args, chat_settings(args))
    assert chat.run() == 0
    out, err = capsys.readouterr()
    assert err.count(RESTARTED_NOTE) == 2
    said = "the engine's runtime restarted: The llama.cpp runtime crashed (SIGSEGV"
    assert err.count(said) == 2
    assert err.count("What it wrote is kept in the chat.") == 2
    assert "starting the engine again" not in err
    assert len(engine_starts) == 1  # the same engine throughout
    # Both counts were on the screen as far as they went (each after a "> " prompt, over
    # as many lines as the model wrote before the crash), and the chat holds the second.
    shown = re.split(r"^> ", out, flags=re.MULTILINE)[1:]
    counts = [text for text in shown if text.strip()]
    assert len(counts) == 2
    assert [message.role for message in chat.messages] == ["user", "assistant"]
    assert chat.messages[1].content.strip()
    assert counts[1].startswith(chat.messages[1].content)


@pytest.mark.real_model
def test_the_chat_app_keeps_the_reply_as_interrupted_and_goes_on_with_the_same_engine(
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

            await send(pilot, COUNT_PROMPT)
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the crash", 120)
            await app.workers.wait_for_complete()
            crashed = replies(app)[-1]
            heading = str(crashed.query_one(".heading").render())
            assert "interrupted: the engine's runtime restarted" in heading
            stored = app.history.messages(app.chat_screen.chat_id)
            assert stored[-1].state == INTERRUPTED
            assert stored[-1].content.strip() and stored[-1].content == crashed.content
            title = "The engine's runtime restarted mid-reply"
            [text] = [text for shown, text in notices() if shown == title]
            assert text.startswith("The engine's runtime restarted: ")
            assert "(SIGSEGV" in text and f"pair '{PAIR}'" in text and "draftpen doctor" in text
            # The app keeps its engine: nothing restarted, nothing started.
            assert app.ready and app.client is not None
            assert len(engine_starts) == 1

    run(body)


@pytest.mark.real_model
def test_the_chat_app_whose_runtime_crashes_loading_says_why_and_starts_no_engine(
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
            assert "The engine's runtime restarted" in status
            assert f"while loading pair '{PAIR}'" in status and "(SIGSEGV" in status
            assert "draftpen doctor" in status
            assert len(engine_starts) == 1 and not app.ready

    run(body)
