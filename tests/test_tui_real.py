"""The chat app with a real model: through the pilot, and as `draftpen` in a terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.settings import Settings
from app.tui.launch import engine_loader_for
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.stats_bar import StatsBar
from backends.engine import Engine, GenerationRequest
from backends.sampling import SamplingParams
from tests.model_files import require_model
from tests.tui_helpers import RecordingEngine, make_app, run, send, settle

pytestmark = pytest.mark.real_model
SMOLLM2 = "smollm2-135m-instruct-q4_1"
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


def test_a_real_model_replies_in_the_app_exactly_as_plain_decoding_would() -> None:
    require_model(SMOLLM2)
    load_real = engine_loader_for(None)

    def recording_loader(name: str) -> Engine:
        loaded = load_real(name, Settings(context_length=2048), lambda text: None)
        return RecordingEngine(loaded.target, loaded.draft, costs=loaded.costs)

    settings = Settings(default_pair="smollm2", temperature=0.0, max_tokens=48, drafter="auto")
    app = make_app(recording_loader, settings=settings, pair_name="smollm2")

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(600):
                await pilot.pause(0.05)
                if app.engine is not None:
                    break
            engine = app.engine
            assert isinstance(engine, RecordingEngine), app.engine_status
            await send(pilot, "List three colours, one per line.")
            await settle(app, pilot)
            reply = [view for view in app.chat_screen.query(MessageView)][-1]
            streamed = "".join(event.text for event in engine.events)
            assert reply.content == streamed and reply.content.strip()
            stats = engine.events[-1].stats
            shown = str(app.chat_screen.query_one(StatsBar).render())
            assert f"{stats.generated_tokens} tokens" in shown
            assert f"{stats.decode_tokens_per_second:.1f} tok/s" in shown
            # Speculation changed nothing: plain decoding of the same prompt agrees.
            plain_request = GenerationRequest(
                prompt_tokens=engine.requests[-1].prompt_tokens,
                params=SamplingParams(temperature=0.0),
                max_tokens=48,
                drafter="none",
            )
            plain = "".join(event.text for event in Engine.generate(engine, plain_request))
            assert reply.content == plain

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


def test_draftpen_with_no_command_opens_the_app_and_ctrl_q_quits(tmp_path: Path) -> None:
    require_model(SMOLLM2)
    settings_dir = Path(os.environ["DRAFTPEN_HOME"]) / "config"
    settings_dir.mkdir(parents=True, exist_ok=True)
    (settings_dir / "settings.toml").write_text('default_pair = "smollm2"\n')
    main_fd, child_fd = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
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
        screen = _read_screen(main_fd, lambda text: "Ready: smollm2" in text, timeout=120)
        assert "Ready: smollm2" in screen, screen[-2000:]
        assert "Stop writing" in screen  # the footer of the chat screen
        os.write(main_fd, b"\x11")  # Ctrl+Q
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(main_fd)
