"""What the engine's HTTP face asks of its queue and of the pairs it holds.

Two shapes answer it: an engine whose runtime runs in its own process (the queue's
worker thread and the :class:`~app.engine.scheduler.PairScheduler`, for tests and
embedding programs), and ``draftpen serve``'s front process, whose runtime runs in a
child it supervises (``runtime_supervisor``). The routes are the same code for both.
"""

from __future__ import annotations

from typing import Protocol

from app.engine.jobs import EngineJob, QueueState
from app.engine.scheduler import LoadOptions, SchedulerSnapshot


class JobQueue(Protocol):
    """Takes jobs, cancels them, says what it is doing, and stops."""

    def start(self) -> None:
        """Start running jobs."""
        ...

    def submit(self, job: EngineJob) -> EngineJob:
        """Queue a job; raises ``QueueFullError`` or ``ShuttingDownError``."""
        ...

    def cancel(self, job: EngineJob, reason: str) -> None:
        """Stop a job, waiting or running; nothing for one already done."""
        ...

    def shutdown(self, reason: str = "server shutting down") -> None:
        """Take no new jobs and cancel every queued and running one."""
        ...

    def join(self, timeout: float) -> bool:
        """Wait for the work to stop after :meth:`shutdown`; False if still busy."""
        ...

    def state(self) -> QueueState:
        """A consistent snapshot of the queue."""
        ...


class HeldPairs(Protocol):
    """Which pair is in memory, and how a pair would be loaded."""

    keep_alive: float | None

    @property
    def loads(self) -> int:
        """How many times a pair was loaded."""
        ...

    def loaded_name(self) -> str | None:
        """The name of the pair in memory, if any."""
        ...

    def options_for(self, name: str) -> LoadOptions:
        """How ``name`` is held now, or would be loaded on demand."""
        ...

    def snapshot(self) -> SchedulerSnapshot:
        """What is loaded and what is loading (may ask another process: call it off
        the event loop)."""
        ...
