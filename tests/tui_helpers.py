"""Building the real chat app around fake or real engines, for pilot-driven tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from app.chats.history import History
from app.settings import Settings
from app.tui.app import DraftpenApp
from app.tui.models_service import PairListing
from backends.engine import Engine, GenerationRequest
from backends.speculative import GenerationEvent
from tests.byte_model import ScriptedByteModel


class RecordingEngine(Engine):
    """An Engine that keeps every event it produced, to compare with what the UI shows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[GenerationEvent] = []
        self.requests: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest, cancel: Any = None):  # type: ignore[override]
        """The shared loop's events, recorded as they pass."""
        self.requests.append(request)
        for event in super().generate(request, cancel):
            self.events.append(event)
            yield event


def scripted_engine(replies: Sequence[str], **model_options: Any) -> RecordingEngine:
    """An engine over :class:`ScriptedByteModel` (no draft model: n-gram drafts)."""
    return RecordingEngine(ScriptedByteModel(replies, **model_options))


class FakeModelsService:
    """Pairs served by scripted engines: two downloaded, one not (no downloads here)."""

    runtime = "llamacpp"

    def __init__(self) -> None:
        self.store = type("Store", (), {"root": "(test store)"})()

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


def make_app(
    engines: dict[str, Engine] | Callable[[str], Engine],
    *,
    settings: Settings | None = None,
    pair_name: str = "fake",
    history: History | None = None,
    models_service: Callable[[], Any] | None = None,
) -> DraftpenApp:
    """The real app with engines served from ``engines`` instead of the model store."""

    def load(name: str, settings: Settings, progress: Callable[[str], None]) -> Engine:
        progress("loading target")
        return engines(name) if callable(engines) else engines[name]

    return DraftpenApp(
        engine_loader=load,
        models_service=models_service or FakeModelsService,
        history=history,
        settings=settings or Settings(default_pair=pair_name, drafter="ngram", temperature=0.0),
        pair_name=pair_name,
    )


def run(coroutine_function: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run an async test body (the suite has no asyncio plugin)."""
    asyncio.run(coroutine_function())


async def settle(app: DraftpenApp, pilot: Any, *, attempts: int = 200) -> None:
    """Wait until no reply is being written and every posted message was handled."""
    for _ in range(attempts):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if app.chat_screen.reply is None and app.engine is not None:
            return
    raise AssertionError(f"the app did not settle: {app.chat_screen.reply!r}")


async def send(pilot: Any, text: str) -> None:
    """Type ``text`` into the prompt and press Enter."""
    prompt = pilot.app.chat_screen.query_one("#prompt")
    prompt.focus()
    prompt.insert(text)
    await pilot.press("enter")
