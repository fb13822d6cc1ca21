"""The chat app around a real engine process (SmolLM2), for the real-model pilot tests:
the engines it started, the app built as for a user, and waiting on what it shows.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.chats.history import History
from app.client import EngineClient, ensure_engine
from app.settings import Settings
from app.tui.app import DraftpenApp
from app.tui.widgets.message_view import MessageView
from tests.support.engine_process import (
    FIXED_DRAFTS,
    short_socket,
    stop_engine,
)
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tui_helpers import FakeModelsService

PAIR = "smollm2"
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
    # More ``draftpen serve`` options for the engines the app starts.
    serve_options: tuple[str, ...] = ()

    def connect(self, settings: Settings, on_status: Callable[[str], None]) -> EngineClient:
        """The app's connector: the real ``ensure_engine``, on this socket."""

        def status(text: str) -> None:
            self.statuses.append(text)
            on_status(text)

        return ensure_engine(
            settings,
            status,
            socket_path=self.socket_path,
            serve_options=["--keep-alive", "-1", *self.serve_options],
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


def make_real_app(
    engines: StartedEngines,
    settings: Settings,
    history: Path,
    models_service: Callable[[], Any] = FakeModelsService,
) -> DraftpenApp:
    return DraftpenApp(
        connect=engines.connect,
        models_service=models_service,
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
