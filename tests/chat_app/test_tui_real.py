"""The chat app against a real engine process (SmolLM2): through the pilot, and in a
terminal.

The app starts the engine as it does for a user (``ensure_engine``: a detached
``draftpen serve``): a reply, Esc, a pair switch, the engine's death survived; a chat
behind an agent; the models screen; ``draftpen`` in a pseudo-terminal.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import DataTable, Label

from app.chats.history import COMPLETE, INTERRUPTED, STOPPED, History
from app.models.catalog_file import forget_command_line_pairs
from app.models.user_pairs import add_user_pair, use_command_line_pair
from app.tui.app import DraftpenApp
from app.tui.models_service import ModelsService
from app.tui.screens.models import ModelsScreen
from app.tui.widgets.stats_bar import StatsBar
from tests.support.engine_fixtures import wait_until
from tests.support.engine_process import (
    COUNTING,
    pid_alive,
    sdk,
    sdk_chat,
)
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.real_engine_app import (
    COUNT_PROMPT,
    PAIR,
    StartedEngines,
    chat_settings,
    make_real_app,
    replies,
    wait_for,
)
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target
from tests.support.tui_helpers import FakeModelsService, run, send

pytestmark = pytest.mark.real_model


ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


def stats_text(app: DraftpenApp) -> str:
    return str(app.chat_screen.query_one(StatsBar).render())


def test_the_app_starts_an_engine_replies_stops_switches_pairs_and_survives_its_death(
    engines: StartedEngines, tmp_path: Path
) -> None:
    # A second name for SmolLM2's file: a pair switch without a second large model.
    add_user_pair("smollm2-again", str(require_model(SMOLLM2_KEY)), None, replace=True)
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

            # Esc stops a long reply at once; what was shown is kept. A new chat: after
            # the colours SmolLM2 (greedy) may answer the count as briefly as it did them.
            app.settings = chat_settings(max_tokens=400)
            await pilot.press("ctrl+n")
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
            assert len(app.history.chats()) == 3  # the earlier chats are kept too
            assert messages[-1].content.strip()

    run(body)


def test_the_app_loads_a_target_pair_through_the_engine_that_never_saw_it(
    engines: StartedEngines, tmp_path: Path
) -> None:
    target = write_tiny_target(tmp_path / "tiny-llama.gguf", require_model(SMOLLM2_KEY), seed=1)
    head = write_eagle3_head(tmp_path / "tiny-llama-eagle3.gguf", target, seed=2)
    name = use_command_line_pair(str(target), str(head))  # `draftpen chat --target` does this
    try:
        app = DraftpenApp(
            connect=engines.connect,
            models_service=FakeModelsService,
            history=History(tmp_path / "history.sqlite3"),
            settings=chat_settings(default_pair=name, max_tokens=12),
            pair_name=name,
        )

        async def body() -> None:
            async with app.run_test(size=(120, 40)) as pilot:
                await wait_for(pilot, lambda: app.ready, "the --target pair to load", 180)
                # The pair drafts with its head, and says so (not "n-gram drafts only").
                assert stats_text(app).startswith(f"Ready: {name} ({name} + eagle3 head)")
                health = engines.client().health()
                assert [(pair.pair, pair.heads) for pair in health.loaded] == [(name, ["eagle3"])]
                await send(pilot, "Name three colours.")
                await wait_for(pilot, lambda: app.chat_screen.reply is None, "the reply", 120)
                stored = app.history.messages(app.chat_screen.chat_id)
                assert stored[-1].role == "assistant" and stored[-1].state == COMPLETE

        run(body)
    finally:
        forget_command_line_pairs()


def test_a_chat_waits_behind_an_agent_on_one_engine_and_both_answer_as_alone(
    engines: StartedEngines, tmp_path: Path
) -> None:
    # One sequence, so the chat waits (with several it writes beside the agent, and
    # the stats line says so: tests/chat_app/test_tui.py, tests/engine/test_parallel_serve.py).
    engines.serve_options = ("--parallel", "1")
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

            # The agent's requests took the engine's cache over; the chat's next turn
            # is brought back from the kept conversation: its history is not read again.
            first = app.history.messages(app.chat_screen.chat_id)[-1].stats
            assert first is not None
            await send(pilot, "And three fruits?")
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the reply", 180)
            second = app.history.messages(app.chat_screen.chat_id)[-1].stats
            assert second is not None
            history = first["loop"]["prompt_tokens"] + first["loop"]["generated_tokens"] - 1
            cached = second["loop"]["cached_prompt_tokens"]
            assert history <= cached < second["loop"]["prompt_tokens"]
            figures = engines.client().health().loaded[0].conversation_cache
            assert figures is not None and figures.restored >= 1

    run(body)


def row_cells(screen: ModelsScreen, pair: str) -> list[str]:
    table = screen.query_one("#pairs", DataTable)
    return [str(cell) for cell in table.get_row(pair)]


def test_the_models_screen_lists_what_the_engine_serves_and_marks_what_it_holds(
    engines: StartedEngines, tmp_path: Path
) -> None:
    # A second name for SmolLM2's file: a second pair without a second large model
    # (the module's home may have it already).
    add_user_pair("smollm2-again", str(require_model(SMOLLM2_KEY)), None, replace=True)
    app = make_real_app(
        engines, chat_settings(), tmp_path / "history.sqlite3", models_service=ModelsService
    )

    async def body() -> None:
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_for(pilot, lambda: app.ready, "the pair to load", 180)
            await pilot.press("ctrl+o")
            screen = app.screen
            assert isinstance(screen, ModelsScreen)
            await wait_for(pilot, lambda: screen.engine_pairs is not None, "the engine", 30)
            served = {card.id: card.loaded for card in engines.client().pairs()}
            assert served[PAIR] and not served["smollm2-again"]
            states = {row.name: row.state for row in screen.rows}
            assert {name: states[name] for name in served} == {
                name: "loaded" if loaded else "downloaded" for name, loaded in served.items()
            }
            assert row_cells(screen, PAIR)[0].startswith("● ")
            assert not row_cells(screen, "smollm2-again")[0].startswith("● ")
            assert f"{PAIR} is loaded" in str(screen.query_one("#engine-pairs", Label).render())

            # An agent names the other pair: the engine switches, and the open screen
            # follows the engine, not the app (which still thinks of its own pair).
            agent = sdk(engines.client())
            agent.chat.completions.create(
                model="smollm2-again",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=4,
                temperature=0,
            )
            await wait_for(
                pilot, lambda: screen.loaded_pair == "smollm2-again", "the screen to follow", 30
            )
            assert row_cells(screen, "smollm2-again")[0].startswith("● ")
            assert row_cells(screen, PAIR)[1] == "downloaded"
            assert app.pair_name == PAIR

            # Enter on the app's own pair: the engine loads it back.
            screen.select_pair(PAIR)
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.screen is app.chat_screen, "the chat", 10)
            await wait_for(pilot, lambda: app.ready, "the pair to load again", 120)
            health = engines.client().health()
            assert [p.pair for p in health.loaded] == [PAIR] and health.loads == 3

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
        cwd=Path(__file__).resolve().parents[2],
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
