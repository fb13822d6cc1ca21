"""One loaded engine, many clients: a bounded FIFO of generations run by one worker thread.

An :class:`~backends.engine.Engine` runs one generation at a time, so the server owns
exactly one worker thread that takes jobs in arrival order and runs
``engine.generate(request, cancel)`` for each; nothing else touches the engine's KV cache.
The HTTP handlers live on the asyncio event loop: a job hands each
:class:`~backends.speculative.GenerationEvent` to its handler through an
``asyncio.Queue`` fed with ``loop.call_soon_threadsafe``, and a handler whose client went
away sets the job's ``threading.Event``, which the loop checks before every round.

Every job ends with exactly one event whose ``finish_reason`` is set (or an exception),
so a handler never has to guess how a generation ended: a job cancelled before it
started gets a synthetic "cancelled" event too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from backends.engine import Engine, GenerationRequest
from backends.speculative import FINISH_CANCELLED, GenerationEvent, SpeculativeStats

logger = logging.getLogger("draftpen.server")

# How many requests may wait behind the running one, unless ``serve --queue`` says.
DEFAULT_QUEUE_LIMIT = 16

# Marks the end of a job's event stream in its inbox.
_END = object()


class QueueFullError(Exception):
    """Every place in the queue is taken; the client should retry later."""


class ShuttingDownError(Exception):
    """The server is stopping and takes no new work."""


@dataclass(eq=False)
class GenerationJob:
    """One request's generation, as the worker and the request's handler share it."""

    id: str
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    cancel_event: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    submitted: float = field(default_factory=time.monotonic)
    delivered: bool = False  # the handler has seen the end (or the error)
    _inbox: asyncio.Queue[object] = field(default_factory=asyncio.Queue)

    def post(self, item: object) -> None:
        """Hand an event, an exception or the end marker to the handler (any thread)."""
        try:
            self.loop.call_soon_threadsafe(self._inbox.put_nowait, item)
        except RuntimeError:
            # The event loop is closed: nobody is listening any more, so stop generating.
            self.cancel_event.set()

    async def events(self) -> AsyncIterator[GenerationEvent]:
        """The job's events in order; the last has a finish_reason. Raises the job's error."""
        while True:
            item = await self._inbox.get()
            if item is _END:
                self.delivered = True
                return
            if isinstance(item, BaseException):
                self.delivered = True
                raise item
            assert isinstance(item, GenerationEvent)
            yield item


@dataclass(frozen=True)
class QueueState:
    """What the queue is doing, for ``GET /health`` and logs."""

    running: str | None
    waiting: int
    limit: int
    completed: int
    cancelled: int
    failed: int
    accepting: bool


class GenerationQueue:
    """A FIFO of generation jobs with a bound, and the one worker thread that runs them.

    ``max_waiting`` bounds the jobs waiting behind the one that runs; :meth:`submit`
    raises :class:`QueueFullError` beyond it. The worker is the only thread that calls
    into the engine for generation.
    """

    def __init__(self, engine: Engine, *, max_waiting: int) -> None:
        if max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        self.engine = engine
        self.max_waiting = max_waiting
        self._condition = threading.Condition()
        self._waiting: deque[GenerationJob] = deque()
        self._running: GenerationJob | None = None
        self._accepting = True
        self._completed = 0
        self._cancelled = 0
        self._failed = 0
        self._thread = threading.Thread(target=self._work, name="draftpen-generation", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def submit(
        self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, *, job_id: str
    ) -> GenerationJob:
        """Queue a generation; its events arrive through the returned job on ``loop``.

        Raises :class:`QueueFullError` when ``max_waiting`` jobs already wait behind the
        running one, and :class:`ShuttingDownError` after :meth:`shutdown`.
        """
        with self._condition:
            if not self._accepting:
                raise ShuttingDownError
            # The job about to run counts as running even before the worker takes it.
            outstanding = len(self._waiting) + (self._running is not None)
            if outstanding > self.max_waiting:
                raise QueueFullError
            job = GenerationJob(job_id, request, loop)
            self._waiting.append(job)
            self._condition.notify()
        return job

    def cancel(self, job: GenerationJob, reason: str) -> None:
        """Stop a job: at once if it still waits, else at the loop's next round.

        Safe to call for a job that already finished (nothing happens).
        """
        with self._condition:
            if job.cancel_event.is_set():
                return
            job.cancel_reason = reason
            job.cancel_event.set()
            try:
                self._waiting.remove(job)
            except ValueError:
                return  # running (the loop will see the event) or already done
            self._cancelled += 1
        logger.info("%s: cancelled while queued (%s)", job.id, reason)
        job.post(_cancelled_event(job.request))
        job.post(_END)

    def shutdown(self, reason: str = "server shutting down") -> None:
        """Take no new jobs and cancel every queued and running one."""
        with self._condition:
            self._accepting = False
            jobs = [*self._waiting, *([self._running] if self._running else [])]
            self._condition.notify_all()
        for job in jobs:
            self.cancel(job, reason)

    def join(self, timeout: float) -> bool:
        """Wait for the worker to exit after :meth:`shutdown`; False if it is still busy."""
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def state(self) -> QueueState:
        """A consistent snapshot of the queue."""
        with self._condition:
            return QueueState(
                running=self._running.id if self._running else None,
                waiting=len(self._waiting),
                limit=self.max_waiting,
                completed=self._completed,
                cancelled=self._cancelled,
                failed=self._failed,
                accepting=self._accepting,
            )

    # -- the worker thread -----------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._condition:
                while not self._waiting and self._accepting:
                    self._condition.wait()
                if not self._waiting:
                    return  # shut down and drained
                job = self._waiting.popleft()
                self._running = job
            outcome = self._run(job)
            with self._condition:
                self._running = None
                if outcome == "completed":
                    self._completed += 1
                elif outcome == "cancelled":
                    self._cancelled += 1
                else:
                    self._failed += 1

    def _run(self, job: GenerationJob) -> str:
        started = time.monotonic()
        last: GenerationEvent | None = None
        try:
            for event in self.engine.generate(job.request, job.cancel_event):
                job.post(event)
                last = event
        except Exception as error:  # reported to the client; the worker lives on
            logger.warning("%s: failed: %s", job.id, error)
            job.post(error)
            job.post(_END)
            return "failed"
        job.post(_END)
        tokens = last.stats.generated_tokens if last else 0
        seconds = time.monotonic() - started
        waited = started - job.submitted
        if last is not None and last.finish_reason == FINISH_CANCELLED:
            logger.info(
                "%s: cancelled after %d tokens in %.2fs (%s)",
                job.id,
                tokens,
                seconds,
                job.cancel_reason or "cancelled",
            )
            return "cancelled"
        logger.info(
            "%s: %d tokens in %.2fs after %.2fs in the queue, finish_reason %s",
            job.id,
            tokens,
            seconds,
            waited,
            last.finish_reason if last else None,
        )
        return "completed"


def _cancelled_event(request: GenerationRequest) -> GenerationEvent:
    """The final event of a job that never ran."""
    return GenerationEvent(
        text="",
        segments=(),
        tokens=(),
        from_draft=(),
        drafter="none",
        draft_length=0,
        stats=SpeculativeStats(prompt_tokens=len(request.prompt_tokens)),
        finish_reason=FINISH_CANCELLED,
    )
