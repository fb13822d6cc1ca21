"""What the engine's queue carries: a job (one client's request, its inbox on the
event loop and its cancel flag), the notices and results it hands back, a snapshot of
the queue, and the queue's refusals. The queue itself is ``queue.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.client.wire import LoadedPairReport, QueueNotice, waiting_label
from app.engine.generation_run import END
from app.engine.scheduler import LoadOptions
from backends.engine import Engine, GenerationRequest

if TYPE_CHECKING:
    from app.models.catalog import Catalog


class QueueFullError(Exception):
    """Every place in the queue is taken; the client should retry later."""


class ShuttingDownError(Exception):
    """The server is stopping and takes no new work."""


class RuntimeStoppedError(Exception):
    """The engine's runtime process died too often and is not started again; the
    message says why and what to do."""


@dataclass(frozen=True)
class LoadingNotice:
    """A line of the engine's progress loading the pair a job needs."""

    text: str


@dataclass(frozen=True)
class Prepared:
    """A generation job's request, built against the loaded engine, and its extras
    (the handler's own, as the response format: the queue only passes them on)."""

    request: GenerationRequest
    extras: Any = None


@dataclass(frozen=True)
class Inspected:
    """What an inspect job's function returned, run against the loaded engine."""

    result: Any


@dataclass(frozen=True)
class LoadedNotice:
    """A load job's end: the pair is in memory (``fresh``: loaded by this job), as
    ``/health`` reports it."""

    report: LoadedPairReport
    fresh: bool


# Builds a job's request against the engine that will run it; raises to refuse it.
Preparer = Callable[[Engine], Prepared]


@dataclass(eq=False)
class EngineJob:
    """One request's work, as the worker and the request's handler share it.

    ``prepare`` None makes it a load job: it loads ``pair`` (with ``load_options``, a
    reload when the pair is held with other ones) and ends; with ``inspect`` it then
    runs that function on the engine (counting a prompt's tokens, say: the worker is
    the only thread that may touch the models) and posts its result as
    :class:`Inspected`.
    """

    id: str
    pair: str
    kind: str  # "chat", "agent" or "load": how it shows in others' queue notices
    loop: asyncio.AbstractEventLoop
    prepare: Preparer | None = None
    load_options: LoadOptions | None = None
    inspect: Callable[[Engine], Any] | None = None
    # A load's pair made from a client's --target/--draft: a runtime process is told it.
    command_line_pair: Catalog | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    submitted: float = field(default_factory=time.monotonic)
    delivered: bool = False  # the handler has seen the end (or the error)
    last_notice: QueueNotice | None = None
    prompt_tokens: int = 0
    _inbox: asyncio.Queue[object] = field(default_factory=asyncio.Queue)

    @property
    def label(self) -> str:
        """How this job shows in another's queue notice: ``"chat (starter)"``."""
        return waiting_label(self.kind, self.pair)

    def post(self, item: object) -> None:
        """Hand an item, an exception or :data:`END` to the handler (any thread)."""
        try:
            self.loop.call_soon_threadsafe(self._inbox.put_nowait, item)
        except RuntimeError:
            # The event loop is closed: nobody is listening any more, so stop generating.
            self.cancel_event.set()

    async def next_item(self, timeout: float | None = None) -> object:
        """The next item; None after ``timeout`` seconds without one.

        :data:`END` ends the job; an exception is the job's error. Both mark it
        delivered.
        """
        try:
            item = await asyncio.wait_for(self._inbox.get(), timeout)
        except TimeoutError:
            return None
        if item is END or isinstance(item, BaseException):
            self.delivered = True
        return item


@dataclass(frozen=True)
class QueueState:
    """What the queue is doing, for ``GET /health`` and logs."""

    running: str | None
    running_label: str | None
    running_count: int  # generations running at once (a parallel engine runs several)
    parallel: int  # how many may run at once, and why fewer than asked (None: as asked)
    parallel_refusal: str | None
    waiting: int
    limit: int
    completed: int
    cancelled: int
    failed: int
    accepting: bool
    # Monotonic time since which nothing has run or waited; None while busy.
    idle_since: float | None


# What the worker's wait returns when keep-alive says to unload the idle pair.
