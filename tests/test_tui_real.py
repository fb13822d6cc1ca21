"""The chat app against a real engine process (SmolLM2): through the pilot, and in a terminal.

The app starts the engine as it does for a user (``ensure_engine``: a detached
``draftpen serve --idle-exit``) on a socket of its own; the tests then check what a
person sees and what the history keeps, against answers the official ``openai`` SDK
gets from the same engine.
"""

from __future__ import annotations

import dataclasses
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.chats.history import COMPLETE, INTERRUPTED, STOPPED, History
from app.client import EngineClient, ensure_engine
from app.models.user_pairs import add_user_pair
from app.settings import Settings
from app.tui.app import DraftpenApp
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.stats_bar import StatsBar
from tests.engine_fixtures import wait_until
from tests.model_files import SMOLLM2_KEY, require_model
from tests.test_engine_clients import (
    COUNTING,
    FIXED_DRAFTS,
    pid_alive,
    sdk,
    sdk_chat,
    short_socket,
    stop_engine,
)
from tests.tui_helpers import FakeModelsService, run, send

pytestmark = pytest.mark.real_model
PAIR = "smollm2"
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")
COUNT_PROMPT = "Count from 1 to 300, separated by commas, nothing else."


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DRAFTPEN_HOME for this module's engines (forward costs measured once)."""
    return tmp_path_factory.mktemp("tui-engine-home")


@pytest.fixture
def engine_home(shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared home, for this test and the engines its app starts."""
    monkeypatch.setenv("DRAFTPEN_HOME", str(shared_home))
    return shared_home


@dataclasses.dataclass
class StartedEngines:
    """The socket the app's engines use, and what ``ensure_engine`` said."""

    socket_path: Path
    statuses: list[str] = dataclasses.field(default_factory=list)

    def connect(self, settings: Settings, on_status: Callable[[str], None]) -> EngineClient:
        """The app's connector: the real ``ensure_engine``, on this socket."""

        def status(text: str) -> None:
            self.statuses.append(text)
            on_status(text)

        return ensure_engine(
            settings, status, socket_path=self.socket_path, serve_options=["--keep-alive", "-1"]
        )

    def client(self) -> EngineClient:
        """A client of whichever engine answers now."""
        return EngineClient(self.socket_path)


@pytest.fixture
def engines(engine_home: Path, request: pytest.FixtureRequest) -> Iterator[StartedEngines]:
    """Where the app starts its engine; whichever runs at the end is stopped."""
    require_model(SMOLLM2_KEY)
    started = StartedEngines(short_socket(request.node.name[:30]))
    try:
        yield started
    finally:
        if started.socket_path.exists():
            stop_engine(started.client())


def chat_settings(**changes: Any) -> Settings:
    """Greedy, fixed n-gram drafts: the same decoding path as the SDK requests below."""
    values: dict[str, Any] = {
        "default_pair": PAIR,
        "temperature": 0.0,
        "max_tokens": 32,
        "drafter": FIXED_DRAFTS["drafter"],
        "draft_tokens": FIXED_DRAFTS["k"],
    }
    return Settings(**{**values, **changes})


def make_real_app(engines: StartedEngines, settings: Settings, history: Path) -> DraftpenApp:
    return DraftpenApp(
        connect=engines.connect,
        models_service=FakeModelsService,
        history=History(history),
        settings=settings,
        pair_name=PAIR,
    )


async def wait_for(pilot: Any, condition: Callable[[], bool], what: str, seconds: float) -> None:
    """Let the app run until ``condition`` holds (models load, engines start: seconds)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            app = pilot.app
            chat_id = app.chat_screen.chat_id
            stored = app.history.messages(chat_id) if chat_id is not None else []
            raise AssertionError(
                f"timed out waiting for {what}: {app.engine_status}; "
                f"{[(m.role, m.state, m.content[:30]) for m in stored]}; "
                f"{[n.message for n in app._notifications]}"
            )
        await pilot.pause(0.05)


def replies(app: DraftpenApp) -> list[MessageView]:
    return [view for view in app.chat_screen.query(MessageView) if view.role == "assistant"]


def stats_text(app: DraftpenApp) -> str:
    return str(app.chat_screen.query_one(StatsBar).render())


def test_the_app_starts_an_engine_replies_stops_switches_pairs_and_survives_its_death(
    engines: StartedEngines, tmp_path: Path
) -> None:
    # A second name for SmolLM2's file: a pair switch without a second large model.
    add_user_pair("smollm2-again", str(require_model(SMOLLM2_KEY)), None)
    app = make_real_app(engines, chat_settings(), tmp_path / "history.sqlite3")

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            # Auto-start: no engine ran; the app started one, said so, and it loaded.
            await wait_for(pilot, lambda: app.ready, "the pair to load", 180)
            assert engines.statuses[0].startswith("Starting the draftpen engine")
            assert stats_text(app).startswith("Ready: smollm2")
            health = engines.client().health()
            assert health.attached_clients == 1 and [p.pair for p in health.loaded] == [PAIR]
            first_pid = health.pid

            # A reply, with provenance and the engine's figures.
            await send(pilot, "Name three colours.")
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the reply", 120)
            [view] = replies(app)
            assert view.content == sdk_chat(sdk(engines.client()), "Name three colours.", 32)
            stored = app.history.messages(app.chat_screen.chat_id)[-1]
            assert stored.state == COMPLETE and stored.stats is not None
            assert "".join(text for text, _ in stored.segments) == view.content
            drafted_text = "".join(text for text, from_draft in stored.segments if from_draft)
            assert bool(drafted_text) == (stored.stats["accepted"] > 0)
            shown = stats_text(app)
            assert f"{stored.stats['generated_tokens']} tokens" in shown
            assert f"{stored.stats['decode_tokens_per_second']:.1f} tok/s" in shown

            # Esc stops a long reply at once; what was shown is kept.
            app.settings = chat_settings(max_tokens=400)
            await send(pilot, COUNT_PROMPT)
            await wait_for(pilot, lambda: len(replies(app)[-1].content) > 20, "text", 120)
            await pilot.press("escape")
            await pilot.pause()
            assert app.chat_screen.reply is None
            stopped = app.history.messages(app.chat_screen.chat_id)[-1]
            assert stopped.state == STOPPED and stopped.content == replies(app)[-1].content
            assert "stopped" in str(replies(app)[-1].query_one(".heading").render())
            wait_until(lambda: engines.client().health().queue.running is None, "the cancel")

            # A pair switch: the engine loads the other pair, once.
            app.load_pair("smollm2-again")
            await wait_for(pilot, lambda: app.ready, "the switch", 120)
            health = engines.client().health()
            assert [p.pair for p in health.loaded] == ["smollm2-again"]
            assert stats_text(app).startswith("Ready: smollm2-again")

            # The engine dies mid-reply: the reply is kept as interrupted, a new engine
            # starts, the chat is intact and goes on. A new chat, so the long count
            # is asked afresh (after the stopped count the model may answer briefly).
            await pilot.press("ctrl+n")
            await send(pilot, COUNT_PROMPT)
            await wait_for(pilot, lambda: len(replies(app)[-1].content) > 20, "text", 120)
            os.kill(health.pid, signal.SIGKILL)
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the loss", 60)
            lost = replies(app)[-1]
            assert "the engine stopped" in str(lost.query_one(".heading").render())
            stored = app.history.messages(app.chat_screen.chat_id)
            assert stored[-1].state == INTERRUPTED and stored[-1].content == lost.content
            assert len(lost.content) > 20
            await wait_for(pilot, lambda: app.ready, "the new engine", 180)
            new_health = engines.client().health()
            assert new_health.pid not in (first_pid, health.pid) and not pid_alive(health.pid)
            assert [p.pair for p in new_health.loaded] == ["smollm2-again"]
            app.settings = chat_settings()
            await send(pilot, "Name three colours.")
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the reply", 120)
            messages = app.history.messages(app.chat_screen.chat_id)
            assert [m.state for m in messages if m.role == "assistant"] == [
                INTERRUPTED,
                COMPLETE,
            ]
            assert len(app.history.chats()) == 2  # the first chat is kept too
            assert messages[-1].content.strip()

    run(body)


def test_a_chat_waits_behind_an_agent_on_one_engine_and_both_answer_as_alone(
    engines: StartedEngines, tmp_path: Path
) -> None:
    app = make_real_app(engines, chat_settings(), tmp_path / "history.sqlite3")
    agent_answers: list[str] = []

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready, "the pair to load", 180)
            openai_client = sdk(engines.client())

            def agent() -> None:  # holds the engine for a while
                answer = openai_client.completions.create(**COUNTING, max_tokens=160)
                agent_answers.append(answer.choices[0].text)

            thread = threading.Thread(target=agent)
            thread.start()
            wait_until(lambda: engines.client().health().queue.running is not None, "the agent")
            await send(pilot, "Name three colours.")
            await wait_for(pilot, lambda: "Waiting for the engine" in stats_text(app), "wait", 30)
            assert "agent request (smollm2)" in stats_text(app)
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the reply", 180)
            thread.join(180)
            [view] = replies(app)
            # Both as each would be alone, from one load of the pair.
            assert view.content == sdk_chat(openai_client, "Name three colours.", 32)
            alone = openai_client.completions.create(**COUNTING, max_tokens=160)
            assert agent_answers == [alone.choices[0].text]
            health = engines.client().health()
            assert health.loads == 1 and [p.pair for p in health.loaded] == [PAIR]

    run(body)


def _read_screen(fd: int, until: Callable[[str], bool], timeout: float) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += ANSI.sub("", chunk.decode("utf-8", errors="replace"))
            if until(seen):
                return seen
    return seen


def test_draftpen_with_no_command_opens_the_app_and_ctrl_q_quits(
    engines: StartedEngines,
) -> None:
    settings_dir = Path(os.environ["DRAFTPEN_HOME"]) / "config"
    settings_dir.mkdir(parents=True, exist_ok=True)
    (settings_dir / "settings.toml").write_text('default_pair = "smollm2"\n')
    main_fd, child_fd = pty.openpty()
    env = {
        **os.environ,
        "TERM": "xterm-256color",
        "COLUMNS": "120",
        "LINES": "40",
        "DRAFTPEN_SOCKET": str(engines.socket_path),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "app.main"],
        stdin=child_fd,
        stdout=child_fd,
        stderr=child_fd,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        start_new_session=True,
    )
    os.close(child_fd)
    try:
        screen = _read_screen(main_fd, lambda text: "Ready: smollm2" in text, timeout=180)
        assert "Ready: smollm2" in screen, screen[-2000:]
        assert "Stop writing" in screen  # the footer of the chat screen
        os.write(main_fd, b"\x11")  # Ctrl+Q
        assert process.wait(timeout=30) == 0
        # The engine it started outlives it (it stops once idle with nobody attached).
        assert engines.client().health().attached_clients == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(main_fd)
