"""The two set-ups benchmarks/ui_cost.py measures the chat app in, chosen by what the
tree's app is: a client of a real ``draftpen serve`` process (now), or in-process with the
pair loaded here (before issue 18). Each writes the same reply headless, drained in a
thread, and builds the app wired to its engine, in a new chat of a new history.

``app`` and ``backends`` are imported inside the functions: from the tree
benchmarks/ui_cost.py put first on the path (``--tree``).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

PROMPT = (
    "Explain how a hash map works in a few short paragraphs, then show a small Python "
    "class implementing one with separate chaining."
)


class Runner:
    """How one set-up writes the reply headless, and how it builds the app."""

    in_process = False

    def headless(self) -> tuple[float, int, int]:
        """The reply with no UI: (decode tok/s, tokens, prompt tokens)."""
        raise NotImplementedError

    def app(self, settings: Any) -> Any:
        """The chat app wired to this set-up's engine."""
        raise NotImplementedError


def _headless_figures(events: Callable[[], Iterable[Any]]) -> tuple[float, int, int]:
    """Drain a reply's events in a thread, as the app's worker does: (decode tok/s,
    tokens, prompt tokens) from the last event's statistics."""
    last: list[Any] = []

    def drain() -> None:
        for event in events():
            last[:] = [event]

    thread = threading.Thread(target=drain)
    thread.start()
    thread.join()
    stats = last[0].stats
    return stats.decode_tokens_per_second, stats.generated_tokens, stats.prompt_tokens


_SHARED_HISTORY: list[Path] = []


def _fresh_history() -> Any:
    """A new, empty chat history: the app opens no earlier chat, so its prompt is PROMPT.

    With ``--same-chat`` every run shares one history, and the app reopens its last chat.
    """
    from app.chats.history import History

    if _SHARED_HISTORY:
        return History(_SHARED_HISTORY[0])
    path = Path(tempfile.mkdtemp(prefix="dp-ui-history-")) / "history.sqlite3"
    if "--same-chat" in sys.argv:
        _SHARED_HISTORY.append(path)
    return History(path)


@contextlib.contextmanager
def in_process_engine(args: argparse.Namespace) -> Iterator[Runner]:
    from app.loading import load_engine
    from app.tui.app import DraftpenApp
    from backends.engine import Engine

    loaded = load_engine(
        args.pair, n_ctx=args.context, calibrate=args.drafter == "auto", on_progress=print
    )

    class KeptEngine(Engine):
        """The loaded models, kept open when an app run ends (it closes its engine)."""

        def close(self) -> None:
            pass

    engine = KeptEngine(loaded.target, loaded.draft, costs=loaded.costs)

    class InProcess(Runner):
        in_process = True

        def headless(self) -> tuple[float, int, int]:
            request = _request(engine, args)
            return _headless_figures(lambda: engine.generate(request))

        def app(self, settings: Any) -> Any:
            return DraftpenApp(
                engine_loader=lambda name, settings, progress: engine,
                history=_fresh_history(),
                settings=settings,
                pair_name=args.pair,
            )

    try:
        yield InProcess()
    finally:
        loaded.close()


@contextlib.contextmanager
def engine_process(args: argparse.Namespace, tree: Path) -> Iterator[Runner]:
    import app.client
    from app.client import ChatTurn, EngineClient, find_engine
    from app.tui.app import DraftpenApp
    from backends.base import ChatMessage
    from backends.generation_events import GenerationEvent

    # A tree from before CancelFlag (2026-11-23) takes a plain Event.
    new_cancel_flag = getattr(app.client, "CancelFlag", threading.Event)

    socket_path = Path(tempfile.mkdtemp(prefix="dp-ui-")) / "engine.sock"
    command = [
        sys.executable, "-m", "app.main", "serve", "--socket", str(socket_path),
        "--keep-alive", "-1", "--context", str(args.context),
    ]  # fmt: skip
    engine = subprocess.Popen(command, cwd=tree, stderr=subprocess.DEVNULL)
    try:
        client = None
        for _ in range(1200):  # the engine answers once it listens
            client = find_engine(socket_path) if socket_path.exists() else None
            if client is not None or engine.poll() is not None:
                break
            time.sleep(0.1)
        if client is None:
            raise SystemExit(f"the engine did not start: {' '.join(command)}")
        client.load(args.pair, on_progress=print, context_length=args.context)
        settings = app_settings(args)
        turn = ChatTurn(
            pair=args.pair,
            messages=(ChatMessage("user", PROMPT),),
            params=settings.sampling_params(),
            max_tokens=settings.max_tokens,
            drafter=settings.drafter,
            draft_tokens=settings.draft_tokens,
        )

        class Client(Runner):
            def headless(self) -> tuple[float, int, int]:
                return _headless_figures(
                    lambda: (
                        item
                        for item in client.chat(turn, new_cancel_flag())
                        if isinstance(item, GenerationEvent)
                    )
                )

            def app(self, settings: Any) -> Any:
                return DraftpenApp(
                    connect=lambda settings, status: EngineClient(socket_path),
                    history=_fresh_history(),
                    settings=settings,
                    pair_name=args.pair,
                )

        yield Client()
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.wait(60)


def _request(engine: Any, args: argparse.Namespace) -> Any:
    from app.settings import Settings
    from backends.base import ChatMessage
    from backends.engine import GenerationRequest

    settings = app_settings(args)
    messages = [ChatMessage("user", PROMPT)]
    if settings.system_prompt.strip():
        messages.insert(0, ChatMessage("system", settings.system_prompt))
    assert isinstance(settings, Settings)
    return GenerationRequest(
        prompt_tokens=tuple(engine.chat_prompt(messages)),
        params=settings.sampling_params(),
        max_tokens=settings.max_tokens,
        drafter=settings.drafter,
        draft_tokens=settings.draft_tokens,
    )


def app_settings(args: argparse.Namespace) -> Any:
    from app.settings import Settings

    return Settings(
        default_pair=args.pair,
        temperature=0.0,
        max_tokens=args.max_tokens,
        drafter=args.drafter,
        context_length=args.context,
    )
