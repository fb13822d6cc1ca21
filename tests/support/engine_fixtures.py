"""An in-process engine over scripted models, with pairs loaded on demand, for fast tests.

:func:`scripted_engine_server` runs the real :class:`~app.engine.runner.AgentServer` (real
uvicorn, a real Unix socket, the real scheduler and queue) whose loader builds a
scripted engine per pair name instead of reading model files; it records every load.
A :class:`GatedEngine` waits for its gate before each generation, so a test can hold
the queue still while it looks at who waits for what.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from app.client import EngineClient
from app.engine.pairs import PairEntryInfo, model_not_found
from app.engine.runner import AgentServer
from app.engine.scheduler import LoadOptions, PairScheduler
from app.engine.schema import ApiError
from app.models.catalog import Catalog
from app.settings import Settings
from backends.engine import Engine, GenerationRequest
from backends.generation_events import GenerationEvent
from tests.support.byte_model import ScriptedByteModel


def reply_of(pair: str) -> str:
    """What the scripted engine of ``pair`` answers to any first message."""
    return f"Hello from {pair}, a scripted pair."


class GatedEngine(Engine):
    """An engine that waits for ``gate`` before each generation and records requests."""

    def __init__(self, model: ScriptedByteModel, gate: threading.Event) -> None:
        super().__init__(model)
        self.gate = gate
        self.requests: list[GenerationRequest] = []
        self.closed = False

    def generate(self, request: GenerationRequest, cancel: Any = None) -> Iterator[GenerationEvent]:  # type: ignore[override]
        """The loop's events, once the gate is open."""
        self.requests.append(request)
        self.gate.wait()
        yield from super().generate(request, cancel)

    def close(self) -> None:
        """Record the unload."""
        self.closed = True
        super().close()


class ScriptedPairs:
    """A pair directory of scripted pairs: every name in ``names`` is downloaded."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def downloaded(self) -> list[PairEntryInfo]:
        """Every scripted pair."""
        return [PairEntryInfo(name, f"{name}-target", None) for name in self.names]

    def check(self, name: str) -> None:
        """404 for a name that is not scripted."""
        if name not in self.names:
            raise model_not_found(
                f"The model '{name}' is not a draftpen pair. Downloaded pairs: "
                f"{', '.join(self.names)}."
            )

    def share(self, name: str, target: str, draft: str | None) -> Catalog:
        """Scripted pairs are made by the test, never from a client's files."""
        raise ApiError(400, f"Scripted pairs only; not {target}.", param="files")


@dataclass
class ScriptedEngineServer:
    """A running in-process engine and what its loader did."""

    server: AgentServer
    socket_path: Path
    gate: threading.Event
    loads: list[tuple[str, LoadOptions]] = field(default_factory=list)
    engines: list[GatedEngine] = field(default_factory=list)
    thread: threading.Thread | None = None

    def client(self) -> EngineClient:
        """draftpen's own client."""
        return EngineClient(self.socket_path)

    def http(self) -> httpx.Client:
        """httpx on the socket."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return httpx.Client(transport=transport, base_url="http://draftpen", timeout=30)

    def openai(self) -> openai.OpenAI:
        """The official SDK, unchanged, on the socket."""
        return openai.OpenAI(
            api_key="unused",
            base_url="http://draftpen/v1",
            http_client=self.http(),
            max_retries=0,
        )


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@contextmanager
def scripted_engine_server(
    tmp_path: Path,
    *,
    names: Sequence[str] = ("alpha", "beta"),
    keep_alive: float | None = None,
    idle_exit: float | None = None,
    load_seconds: float = 0.0,
    n_ctx: int = 4096,
    queue_limit: int = 16,
    make_model: Callable[[str, int], ScriptedByteModel] | None = None,
) -> Iterator[ScriptedEngineServer]:
    """An engine serving scripted pairs on a socket in ``tmp_path``; stopped on exit.

    ``make_model(name, n_ctx)`` builds a pair's model (default: one that answers
    :func:`reply_of` the pair's name).
    """
    gate = threading.Event()
    gate.set()
    path = tmp_path / "engine.sock"
    running: ScriptedEngineServer | None = None

    def load(name: str, options: LoadOptions, report: Callable[[str], None]) -> Engine:
        report(f"reading {name}")
        time.sleep(load_seconds)  # long enough for other requests to arrive meanwhile
        if make_model is not None:
            model = make_model(name, options.context_length)
        else:
            model = ScriptedByteModel(
                [reply_of(name)], name=f"{name}-target", n_ctx=options.context_length
            )
        engine = GatedEngine(model, gate)
        assert running is not None
        running.loads.append((name, options))
        running.engines.append(engine)
        return engine

    scheduler = PairScheduler(load, LoadOptions(n_ctx, False), keep_alive=keep_alive)
    server = AgentServer(
        socket_path=path,
        settings=Settings(drafter="none", temperature=0.0),
        scheduler=scheduler,
        pairs=ScriptedPairs(names),
        queue_limit=queue_limit,
        configure_logging=False,
        idle_exit=idle_exit,
    )
    running = ScriptedEngineServer(server, path, gate)
    listening = threading.Event()
    thread = threading.Thread(target=server.run, kwargs={"announce": lambda _: listening.set()})
    running.thread = thread
    thread.start()
    try:
        assert listening.wait(10)
        yield running
    finally:
        gate.set()
        server.stop()
        thread.join(15)
        assert not thread.is_alive(), "the engine did not stop"
