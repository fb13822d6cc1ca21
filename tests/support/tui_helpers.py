"""Building the real chat app around fake or real engines, for pilot-driven tests.

The app is a client of the engine, so :func:`make_app` starts the real engine server
(``app.engine``: uvicorn on a real Unix socket, the scheduler, the queue) in this
process, whose loader hands out the test's scripted engines; the app talks to it
through the real ``app.client``. :func:`stop_engine_servers` (an autouse fixture in
the TUI test modules) stops them after each test.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from app.chats.history import History
from app.client import EngineClient
from app.engine.runner import AgentServer
from app.engine.scheduler import LoadOptions, PairScheduler
from app.models.sources.on_this_machine import ScanResult
from app.settings import Settings
from app.tui.app import DraftpenApp
from app.tui.models_service import PairListing
from app.tui.widgets.message_view import MessageView
from backends.engine import Engine, GenerationRequest
from backends.generation_events import GenerationEvent
from tests.support.byte_model import ScriptedByteModel
from tests.support.engine_fixtures import ScriptedPairs


class RecordingEngine(Engine):
    """An Engine that keeps every event it produced, to compare with what the UI shows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[GenerationEvent] = []
        self.requests: list[GenerationRequest] = []
        self.cancels: list[Any] = []  # each generation's cancel flag, as the engine set it

    def generate(self, request: GenerationRequest, cancel: Any = None):  # type: ignore[override]
        """The shared loop's events, recorded as they pass."""
        self.requests.append(request)
        self.cancels.append(cancel)
        for event in super().generate(request, cancel):
            self.events.append(event)
            yield event


def scripted_engine(replies: Sequence[str], **model_options: Any) -> RecordingEngine:
    """An engine over :class:`ScriptedByteModel` (no draft model: n-gram drafts)."""
    return RecordingEngine(ScriptedByteModel(replies, **model_options))


class FakeModelsService:
    """Pairs served by scripted engines: two downloaded, one not (no downloads here)."""

    runtime = "llamacpp"
    recommendation = None

    def __init__(self) -> None:
        self.store = type("Store", (), {"root": "(test store)"})()

    def scan(self) -> ScanResult:
        """Nothing found on this (fake) machine."""
        return ScanResult((), (), ())

    def rows(self) -> list[PairListing]:
        """Three pairs: ``fake`` and ``other`` downloaded, ``missing`` absent."""
        return [
            PairListing(
                "fake", "A scripted model", "llamacpp", 1000, None, "fits RAM", True, "downloaded"
            ),
            PairListing(
                "other", "Another one", "llamacpp", 1000, 500, "fits RAM", True, "downloaded"
            ),
            PairListing("missing", "Not here", "llamacpp", 1000, 500, "fits RAM", True, "absent"),
        ]


class EngineForApp:
    """A real engine server in this process, serving the test's engines by pair name."""

    def __init__(
        self, engines: dict[str, Engine] | Callable[[str], Engine], names: Sequence[str]
    ) -> None:
        self.engines = engines
        self.loads: list[tuple[str, LoadOptions]] = []
        self.loaded: list[Engine] = []
        self.directory = Path(tempfile.mkdtemp(prefix="dp-tui-"))  # short: socket paths
        self.socket_path = self.directory / "engine.sock"
        scheduler = PairScheduler(self._load, LoadOptions(4096, False))
        self.server = AgentServer(
            socket_path=self.socket_path,
            settings=Settings(drafter="none", temperature=0.0),
            scheduler=scheduler,
            pairs=ScriptedPairs(names),
            configure_logging=False,
        )
        listening = threading.Event()
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"announce": lambda _: listening.set()}, daemon=True
        )
        self.thread.start()
        assert listening.wait(15), "the test engine did not start"

    def _load(self, name: str, options: LoadOptions, report: Callable[[str], None]) -> Engine:
        report("loading target")
        engine = self.engines(name) if callable(self.engines) else self.engines[name]
        self.loads.append((name, options))
        self.loaded.append(engine)
        return engine

    @property
    def engine(self) -> Engine:
        """The engine loaded last."""
        return self.loaded[-1]

    def client(self) -> EngineClient:
        """draftpen's own client of this engine."""
        return EngineClient(self.socket_path)

    def stop(self) -> None:
        """Stop the server (its generations are cancelled) and remove its socket."""
        self.server.stop()
        self.thread.join(15)
        shutil.rmtree(self.directory, ignore_errors=True)


_running: list[EngineForApp] = []


@pytest.fixture(autouse=True)
def stop_engine_servers() -> Iterator[None]:
    """Stop every engine :func:`make_app` started during the test."""
    yield
    while _running:
        with contextlib.suppress(Exception):
            _running.pop().stop()


def make_app(
    engines: dict[str, Engine] | Callable[[str], Engine],
    *,
    settings: Settings | None = None,
    pair_name: str = "fake",
    history: History | None = None,
    models_service: Callable[[], Any] | None = None,
    names: Sequence[str] = ("fake", "other"),
) -> DraftpenApp:
    """The real app, a client of a real engine that serves ``engines`` (``app.served``).

    Pairs not in ``engines`` (or, for a callable, not in ``names``) are not downloaded.
    """
    served = EngineForApp(engines, list(engines) if isinstance(engines, dict) else names)
    _running.append(served)
    app = DraftpenApp(
        connect=lambda settings, status: served.client(),
        models_service=models_service or FakeModelsService,
        history=history,
        settings=settings or Settings(default_pair=pair_name, drafter="ngram", temperature=0.0),
        pair_name=pair_name,
    )
    app.served = served  # type: ignore[attr-defined]
    return app


def run(coroutine_function: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run an async test body (the suite has no asyncio plugin)."""
    asyncio.run(coroutine_function())


async def settle(app: DraftpenApp, pilot: Any, *, attempts: int = 200) -> None:
    """Wait until no reply is being written and every posted message was handled."""
    for _ in range(attempts):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if app.chat_screen.reply is None and app.ready:
            return
    raise AssertionError(f"the app did not settle: {app.chat_screen.reply!r}")


async def send(pilot: Any, text: str) -> None:
    """Type ``text`` into the prompt and press Enter."""
    prompt = pilot.app.chat_screen.query_one("#prompt")
    prompt.focus()
    prompt.insert(text)
    await pilot.press("enter")


async def wait_until_ready(app: DraftpenApp, pilot: Any) -> None:
    """Until the engine holds the pair."""
    for _ in range(200):
        await pilot.pause()
        if app.ready:
            return
    raise AssertionError(f"engine never loaded: {app.engine_status}")


def reply_views(app: DraftpenApp) -> list[MessageView]:
    """The assistant's messages on screen."""
    return [view for view in app.chat_screen.query(MessageView) if view.role == "assistant"]
