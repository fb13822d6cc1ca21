"""One engine, many clients: a bounded FIFO of jobs run by one worker thread.

An :class:`~backends.engine.Engine` runs one generation at a time, so the server owns
exactly one worker thread that takes jobs in arrival order. A job names the pair it
needs; the worker has the :class:`~app.engine.scheduler.PairScheduler` load it if it is
not in memory (so however many clients ask for a pair at once, it is loaded once: the
first job loads it, the others find it loaded), then builds the job's generation request
against the loaded engine (``prepare``: the chat template, the context checks) and runs
``engine.generate(request, cancel)``. A load job (``POST /draftpen/load``) only loads.
Nothing else touches the models (keep-alive unloads and ``serve --pair`` run here too).

The HTTP handlers live on the asyncio event loop: a job hands its items (notices, the
prepared request's extras, each :class:`~backends.generation_events.GenerationEvent`,
then an end marker or an exception) to its handler through an ``asyncio.Queue`` fed
with ``loop.call_soon_threadsafe``. A handler whose client went away sets the job's
``threading.Event``, which the loop checks before every round. Waiting jobs are told
their place whenever it changes.

Every generation job ends with exactly one event whose ``finish_reason`` is set (or an
exception), so a handler never has to guess how a generation ended: a job cancelled
before it started gets a synthetic "cancelled" event too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.client.wire import QueueNotice, waiting_label
from app.engine.crash_record import generating
from app.engine.scheduler import LoadedPair, LoadOptions, PairScheduler
from backends.engine import Engine, GenerationRequest
from backends.generation_events import FINISH_CANCELLED, GenerationEvent, SpeculativeStats

logger = logging.getLogger("draftpen.server")

# How many requests may wait behind the running one, unless ``serve --queue`` says.
DEFAULT_QUEUE_LIMIT = 16

# Marks the end of a job's items in its inbox.
END = object()

T = TypeVar("T")


class QueueFullError(Exception):
    """Every place in the queue is taken; the client should retry later."""


class ShuttingDownError(Exception):
    """The server is stopping and takes no new work."""


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
    """A load job's end: the pair is in memory (``fresh``: loaded by this job)."""

    loaded: LoadedPair
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
    waiting: int
    limit: int
    completed: int
    cancelled: int
    failed: int
    accepting: bool
    # Monotonic time since which nothing has run or waited; None while busy.
    idle_since: float | None


# What the worker's wait returns when keep-alive says to unload the idle pair.
_KEEP_ALIVE_EXPIRED = object()


class GenerationQueue:
    """A FIFO of jobs with a bound, and the one worker thread that runs them.

    ``max_waiting`` bounds the jobs waiting behind the one that runs; :meth:`submit`
    raises :class:`QueueFullError` beyond it. The worker is the only thread that loads,
    uses and unloads models.
    """

    def __init__(self, scheduler: PairScheduler, *, max_waiting: int) -> None:
        if max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        self.scheduler = scheduler
        self.max_waiting = max_waiting
        self._condition = threading.Condition()
        self._waiting: deque[EngineJob] = deque()
        self._running: EngineJob | None = None
        self._accepting = True
        self._completed = 0
        self._cancelled = 0
        self._failed = 0
        self._idle_since: float | None = time.monotonic()
        # Work handed to the worker thread by run_on_worker, taken before any job.
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._thread = threading.Thread(target=self._work, name="draftpen-engine", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def run_on_worker(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the worker thread, ahead of any job; its result or its error.

        All model work belongs on this one thread, loading (which calibrates) included:
        see ``backends/llamacpp/library.py`` for why a second thread slows llama.cpp."""
        future: Future[T] = Future()
        with self._condition:
            if not self._accepting:
                raise ShuttingDownError
            self._calls.append((work, future))
            self._condition.notify()
        return future.result()

    def submit(self, job: EngineJob) -> EngineJob:
        """Queue a job; its items arrive through it on its loop.

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
            self._waiting.append(job)
            self._idle_since = None
            self._tell_positions()
            self._condition.notify()
        return job

    def cancel(self, job: EngineJob, reason: str) -> None:
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
            self._tell_positions()
            if self._running is None and not self._waiting:
                self._idle_since = time.monotonic()
        logger.info("%s: cancelled while queued (%s)", job.id, reason)
        if job.prepare is not None:
            job.post(_cancelled_event(job.prompt_tokens))
        job.post(END)

    def shutdown(self, reason: str = "server shutting down") -> None:
        """Take no new jobs and cancel every queued and running one."""
        with self._condition:
            self._accepting = False
            jobs = [*self._waiting, *([self._running] if self._running else [])]
            calls, self._calls = list(self._calls), deque()
            self._condition.notify_all()
        for _, future in calls:
            future.set_exception(ShuttingDownError())
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
            running = self._running
            return QueueState(
                running=running.id if running else None,
                running_label=running.label if running else None,
                waiting=len(self._waiting),
                limit=self.max_waiting,
                completed=self._completed,
                cancelled=self._cancelled,
                failed=self._failed,
                accepting=self._accepting,
                idle_since=self._idle_since,
            )

    def wake(self) -> None:
        """Make the worker look at keep-alive again (after a setting changed)."""
        with self._condition:
            self._condition.notify_all()

    # -- the worker thread -----------------------------------------------------

    def _tell_positions(self) -> None:
        """Tell each waiting job where it stands, if that changed (lock held)."""
        ahead = [self._running.label] if self._running is not None else []
        for job in self._waiting:
            notice = QueueNotice(position=len(ahead), ahead=list(ahead))
            # Nothing ahead: it runs at once, so there is no wait to tell of.
            if ahead and notice != job.last_notice:
                job.last_notice = notice
                job.post(notice)
            ahead.append(job.label)

    def _next_job(self) -> EngineJob | object | None:
        """The next job; :data:`_KEEP_ALIVE_EXPIRED` to unload; a call from
        :meth:`run_on_worker`; None once shut down."""
        with self._condition:
            while not self._waiting and not self._calls:
                if not self._accepting:
                    return None
                deadline = self.scheduler.unload_deadline()
                if deadline is None:
                    self._condition.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return _KEEP_ALIVE_EXPIRED
                self._condition.wait(remaining)
            if self._calls:
                return self._calls.popleft()
            job = self._waiting.popleft()
            self._running = job
            self._tell_positions()
            return job

    def _work(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return  # shut down and drained
            if job is _KEEP_ALIVE_EXPIRED:
                keep_alive = self.scheduler.keep_alive
                self.scheduler.unload(f"idle for {keep_alive:g}s (keep-alive)")
                continue
            if isinstance(job, tuple):
                work, future = job
                try:
                    future.set_result(work())
                except BaseException as error:  # handed to the caller, who re-raises it
                    future.set_exception(error)
                continue
            assert isinstance(job, EngineJob)
            outcome = self._run(job)
            with self._condition:
                self._running = None
                if outcome == "completed":
                    self._completed += 1
                elif outcome == "cancelled":
                    self._cancelled += 1
                else:
                    self._failed += 1
                self._tell_positions()
                if not self._waiting:
                    self._idle_since = time.monotonic()

    def _run(self, job: EngineJob) -> str:
        started = time.monotonic()
        try:
            loaded, fresh = self.scheduler.acquire(
                job.pair, job.load_options, lambda text: job.post(LoadingNotice(text))
            )
        except Exception as error:  # reported to the client; the worker lives on
            logger.warning("%s: cannot load %s: %s", job.id, job.pair, error)
            job.post(error)
            job.post(END)
            return "failed"
        try:
            if job.inspect is not None:
                return self._inspect(job, loaded.engine)
            if job.prepare is None:
                job.post(LoadedNotice(loaded, fresh))
                job.post(END)
                return "completed"
            return self._generate(job, loaded.engine, started)
        finally:
            self.scheduler.touch()

    def _inspect(self, job: EngineJob, engine: Engine) -> str:
        assert job.inspect is not None
        try:
            result = job.inspect(engine)
        except Exception as error:  # reported to the client; the worker lives on
            job.post(error)
            job.post(END)
            return "failed"
        job.post(Inspected(result))
        job.post(END)
        return "completed"

    def _generate(self, job: EngineJob, engine: Engine, started: float) -> str:
        assert job.prepare is not None
        last: GenerationEvent | None = None
        try:
            # Recorded: a runtime that crashes here is reported with the pair it ran.
            with generating(job.pair):
                prepared = job.prepare(engine)
                job.prompt_tokens = len(prepared.request.prompt_tokens)
                job.post(prepared)
                for event in engine.generate(prepared.request, job.cancel_event):
                    job.post(event)
                    last = event
        except Exception as error:  # reported to the client; the worker lives on
            logger.warning("%s: failed: %s", job.id, error)
            job.post(error)
            job.post(END)
            return "failed"
        job.post(END)
        stats = last.stats if last else SpeculativeStats()
        tokens, seconds = stats.generated_tokens, time.monotonic() - started
        if last is not None and last.finish_reason == FINISH_CANCELLED:
            logger.info(
                "%s: cancelled after %d tokens in %.2fs (%s)",
                job.id,
                tokens,
                seconds,
                job.cancel_reason or "cancelled",
            )
            return "cancelled"
        # The prompt's cached share says whether an agent's turn read only what was new.
        logger.info(
            "%s: %d tokens in %.2fs after %.2fs in the queue, finish_reason %s; "
            "prompt %d tokens, %d of them cached, read in %.2fs, first token after %.2fs",
            job.id,
            tokens,
            seconds,
            started - job.submitted,
            last.finish_reason if last else None,
            stats.prompt_tokens,
            stats.cached_prompt_tokens,
            stats.prefill_seconds,
            stats.time_to_first_token,
        )
        return "completed"


def _cancelled_event(prompt_tokens: int) -> GenerationEvent:
    """The final event of a job that never ran."""
    return GenerationEvent(
        text="",
        segments=(),
        tokens=(),
        from_draft=(),
        drafter="none",
        draft_length=0,
        stats=SpeculativeStats(prompt_tokens=prompt_tokens),
        finish_reason=FINISH_CANCELLED,
    )
