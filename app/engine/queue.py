"""One engine, many clients: a bounded FIFO of jobs and the one worker thread that
runs the runtime.

The worker takes jobs in arrival order. A job names the pair it needs; the worker has
the :class:`~app.engine.scheduler.PairScheduler` load it if it is not in memory (so
however many clients ask for a pair at once, it is loaded once: the first job loads
it, the others find it loaded), then builds the job's generation request
against the loaded engine (``prepare``: the chat template, the context checks) and runs
``engine.generate(request, cancel)``. A load job (``POST /draftpen/load``) only loads.
Nothing else touches the models (keep-alive unloads and ``serve --pair`` run here too).
A parallel engine (``serve --parallel N``) runs up to N generations at once, each on a
thread of its own and a slot of the engine, while the worker runs their batched
decodes (``backends/runtime_exchange.py``); a load, or another pair, waits for them.

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

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from app.client.wire import QueueNotice
from app.engine.generation_run import END, cancelled_event, run_generation
from app.engine.jobs import (
    EngineJob,
    Inspected,
    LoadedNotice,
    LoadingNotice,
    QueueFullError,
    QueueState,
    ShuttingDownError,
)
from app.engine.scheduler import PairScheduler
from backends.engine import Engine
from backends.engine_slots import EngineSlots, parallel_of, slots_for
from backends.runtime_exchange import RuntimeExchange

logger = logging.getLogger("draftpen.server")

# How many requests may wait behind the running one, unless ``serve --queue`` says.
DEFAULT_QUEUE_LIMIT = 16
T = TypeVar("T")


_KEEP_ALIVE_EXPIRED = object()


class GenerationQueue:
    """A FIFO of jobs with a bound, and the one worker thread that runs them.

    ``max_waiting`` bounds the jobs waiting behind those that run; :meth:`submit` raises
    :class:`QueueFullError` beyond it. The worker alone loads, runs and unloads models.
    """

    def __init__(self, scheduler: PairScheduler, *, max_waiting: int) -> None:
        if max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        self.scheduler = scheduler
        self.max_waiting = max_waiting
        self._condition = threading.Condition()
        self._waiting: deque[EngineJob] = deque()
        self._running: EngineJob | None = None
        # Jobs generating on a parallel engine's slots, each on a thread of its own,
        # while the worker runs the runtime's batched decodes (backends/engine_slots.py).
        self._on_slots: list[EngineJob] = []
        # Of those, the ones still setting up (their prompt not yet on a sequence).
        self._starting: set[EngineJob] = set()
        self._slots: EngineSlots | None = None
        self._parallel: tuple[int, str | None] = (scheduler.defaults.parallel or 1, None)
        self.exchange = RuntimeExchange(self._condition)
        self.exchange.arriving = self._arriving
        self._accepting = True
        self._completed = self._cancelled = self._failed = 0
        self._idle_since: float | None = time.monotonic()
        self._thread = threading.Thread(target=self._work, name="draftpen-engine", daemon=True)
        # Hooks for an engine whose front runs in another process (runtime_child.py):
        # a job the worker took, before it starts on it (called on the worker, no lock
        # held); and "the state may have changed" (lock held: it must only take note).
        self.on_taken: Callable[[EngineJob], None] | None = None
        self.on_change: Callable[[], None] | None = None

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def run_on_worker(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the worker thread, ahead of any job; its result or its error.

        All model work belongs on this one thread, loading (which calibrates) included:
        see ``backends/llamacpp/library.py`` for why a second thread slows llama.cpp."""
        if self.exchange.on_runtime_thread():
            return work()
        with self._condition:
            # Checked and handed over under one lock: none is handed over after shutdown.
            if not self._accepting:
                raise ShuttingDownError
            future = self.exchange.submit(work)
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
            running = (self._running is not None) + len(self._on_slots)
            slots = self._slots.count if self._slots is not None else 1
            if len(self._waiting) + running > self.max_waiting + max(0, slots - 1):
                raise QueueFullError
            self._waiting.append(job)
            self._idle_since = None
            self._tell_positions()
            self._changed()
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
            self._changed()
            if self._running is None and not self._waiting and not self._on_slots:
                self._idle_since = time.monotonic()
        logger.info("%s: cancelled while queued (%s)", job.id, reason)
        if job.prepare is not None:
            job.post(cancelled_event(job.prompt_tokens))
        job.post(END)

    def shutdown(self, reason: str = "server shutting down") -> None:
        """Take no new jobs and cancel every queued and running one."""
        with self._condition:
            self._accepting = False
            jobs = [*self._waiting, *([self._running] if self._running else []), *self._on_slots]
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
            running = self._running or (self._on_slots[0] if self._on_slots else None)
            return QueueState(
                running=running.id if running else None,
                running_label=running.label if running else None,
                running_count=(self._running is not None) + len(self._on_slots),
                parallel=self._parallel[0],
                parallel_refusal=self._parallel[1],
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

    def _changed(self) -> None:
        """Tell the hook that the queue's state may have changed (lock held)."""
        if self.on_change is not None:
            self.on_change()

    def _tell_positions(self) -> None:
        """Tell each waiting job where it stands, if that changed (lock held)."""
        ahead = [self._running.label] if self._running is not None else []
        ahead += [job.label for job in self._on_slots]
        capacity = self._slots.count if self._slots is not None else 1
        for job in self._waiting:
            notice = QueueNotice(position=len(ahead), ahead=list(ahead))
            # A free place (nothing ahead, or a free slot): it runs at once, so there
            # is no wait to tell of.
            if len(ahead) >= capacity and notice != job.last_notice:
                job.last_notice = notice
                job.post(notice)
            ahead.append(job.label)

    def _next_job(self) -> EngineJob | object | None:
        """The next job; :data:`_KEEP_ALIVE_EXPIRED` to unload; runtime work (a call
        from :meth:`run_on_worker`, the slots' decodes) as a :class:`_RuntimeWork`;
        None once shut down."""
        with self._condition:
            while True:
                # Calls first, then a job that may start: the slots' decodes keep coming
                # while a prompt is read, and a new generation must not wait for its end.
                startable = self._waiting and self._may_start(self._waiting[0])
                if startable and not self.exchange.has_calls():
                    job = self._waiting.popleft()
                    self._running = job
                    self._tell_positions()
                    self._changed()
                    return job
                now = time.monotonic()
                work, wake_at = self.exchange.next_work(now)
                if work is not None:
                    return _RuntimeWork(work)
                if not self._accepting and not self._on_slots:
                    return None
                deadline = None if self._on_slots else self.scheduler.unload_deadline()
                if deadline is not None and deadline <= now:
                    return _KEEP_ALIVE_EXPIRED
                if wake_at is not None:
                    deadline = wake_at if deadline is None else min(deadline, wake_at)
                self._condition.wait(None if deadline is None else max(0.0, deadline - now))

    def _may_start(self, job: EngineJob) -> bool:
        """Whether ``job`` may start now (lock held): anything when nothing generates
        on slots; beside them, only a generation on the loaded pair, as it is loaded,
        while a slot is free (a load or another pair waits for them to finish)."""
        if not self._on_slots:
            return True
        slots = self._slots
        return (
            slots is not None
            and len(self._on_slots) < slots.count
            and job.prepare is not None
            and job.inspect is None
            and job.load_options is None
            and job.pair == self.scheduler.loaded_name()
        )

    def _work(self) -> None:
        # This thread runs all of the runtime's work, the slots' decodes included.
        self.exchange.bind()
        while True:
            job = self._next_job()
            if job is None:
                return  # shut down and drained
            if isinstance(job, _RuntimeWork):
                job.work()
                continue
            if job is _KEEP_ALIVE_EXPIRED:
                keep_alive = self.scheduler.keep_alive
                self.scheduler.unload(f"idle for {keep_alive:g}s (keep-alive)")
                with self._condition:
                    self._changed()
                continue
            # An EngineJob, or the runtime process's stand-in for one (runtime_child.py).
            job = cast(EngineJob, job)
            if self.on_taken is not None:
                # Outside the lock: the hook may wait until the front knows (a runtime
                # that dies from here on costs this job's reply).
                self.on_taken(job)
            outcome = self._run(job)
            with self._condition:
                self._running = None
                if outcome != "on a slot":
                    self._count(outcome)

    def _count(self, outcome: str) -> None:
        """Count a finished job and tell the others (lock held)."""
        if outcome == "completed":
            self._completed += 1
        elif outcome == "cancelled":
            self._cancelled += 1
        else:
            self._failed += 1
        self._tell_positions()
        self._changed()
        if not self._waiting and not self._on_slots and self._running is None:
            self._idle_since = time.monotonic()
        self._condition.notify_all()

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
                job.post(LoadedNotice(self.scheduler.report(loaded), fresh))
                job.post(END)
                return "completed"
            self._parallel = parallel_of(loaded.engine, loaded.options.parallel)
            self._slots = slots = slots_for(loaded.engine, self._slots, self.exchange)
            if slots is None:
                return run_generation(job, loaded.engine, started)
            with self._condition:
                # It moves from running on the worker to a slot, in one step: counted
                # in both, /health said 4 running on 3 slots (16 clients, CI).
                self._running = None
                self._on_slots.append(job)
                self._starting.add(job)
            arguments = (job, loaded.engine, slots, started)
            threading.Thread(target=self._run_on_slot, args=arguments, daemon=True).start()
            return "on a slot"
        finally:
            self.scheduler.touch()

    def _run_on_slot(
        self, job: EngineJob, engine: Engine, slots: EngineSlots, started: float
    ) -> None:
        """A generation's own thread: its loop on a slot; the worker runs its decodes."""
        outcome = "failed"
        try:
            outcome = run_generation(job, engine, started, slots, lambda: self._started(job))
        finally:
            with self._condition:
                self._starting.discard(job)
                self._on_slots.remove(job)
                self._count(outcome)
            self.scheduler.touch()

    def _started(self, job: EngineJob) -> None:
        """``job`` holds its slot: it is no longer arriving."""
        with self._condition:
            self._starting.discard(job)

    def _arriving(self) -> bool:
        """Whether a generation is on its way to a free slot (condition held): one
        setting up on its thread, or one queued that a slot is free for."""
        if self._starting:
            return True
        slots = self._slots
        free = slots is not None and len(self._on_slots) < slots.count
        return free and any(job.prepare is not None for job in self._waiting)

    def _inspect(self, job: EngineJob, engine: Engine) -> str:
        assert job.inspect is not None
        outcome = "completed"
        try:
            job.post(Inspected(job.inspect(engine)))
        except Exception as error:  # reported to the client; the worker lives on
            job.post(error)
            outcome = "failed"
        job.post(END)
        return outcome


@dataclass(frozen=True)
class _RuntimeWork:
    """A piece of the runtime's work the worker runs for generations on slots."""

    work: Callable[[], None]
