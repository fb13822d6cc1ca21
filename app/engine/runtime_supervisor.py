"""The engine's front process's side of its runtime: start it, feed it, watch it.

:class:`RuntimeSupervisor` stands where an engine in one process has its
:class:`~app.engine.queue.GenerationQueue` and :class:`~app.engine.scheduler.PairScheduler`
(``engine_parts``: the HTTP face cannot tell them apart). It starts the runtime process
(``runtime_child``, with multiprocessing's ``spawn``: never a fork of a process that
runs threads), sends it each job's runtime half, and hands what comes back to the
job's handler on the event loop: notices, the answer's format (made here, from the
prepared inputs: the dialect's format never leaves this process), the loop's events.

When the runtime dies (an abort in llama.cpp or MLX, a lost worker, SIGKILL), its pipe
closes: every job it had taken gets an error in its dialect's shape that says why
(``runtime_deaths``), after what it had streamed; jobs that only waited are kept and
sent to the next runtime, which is started at once with the pair and options the dead
one held. After :data:`~app.engine.runtime_deaths.CRASH_LIMIT` deaths within the window
it is not started again: ``/health`` says why and what to do, requests get a 503 that
says so, and a ``POST /draftpen/load`` starts it again. The sockets never close.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time

from app.client.wire import RuntimeReport
from app.engine.jobs import (
    EngineJob,
    QueueFullError,
    QueueState,
    RuntimeStoppedError,
    ShuttingDownError,
)
from app.engine.runtime_deaths import (
    CrashWindow,
    death_reason,
    restarted_error,
    runtime_stopped_error,
    stopped_reason,
)
from app.engine.runtime_jobs import CANCELLED, FAILED, TrackedJob
from app.engine.runtime_link import RuntimeLink
from app.engine.runtime_wire import (
    AskSnapshot,
    CancelJob,
    JobEnd,
    JobItem,
    JobTaken,
    RuntimeReady,
    RuntimeSpec,
    RuntimeState,
    SnapshotAnswer,
    StopRuntime,
)
from app.engine.scheduler import LoadOptions, SchedulerSnapshot
from app.errors import DraftpenError
from app.models.catalog_file import command_line_pairs

logger = logging.getLogger("draftpen.server")

STARTING, RUNNING, RESTARTING, STOPPED = "starting", "running", "restarting", "stopped"
# How long /health waits for the runtime's snapshot before it reports the last known.
_SNAPSHOT_SECONDS = 2.0


class RuntimeSupervisor:
    """The runtime process, started and supervised; the queue and the pairs held, as
    the HTTP face asks for them (``engine_parts.JobQueue`` and ``HeldPairs``).

    ``max_waiting`` bounds the jobs waiting behind those that run, as the queue's does;
    ``crashes``: how many deaths within its window stop the restarts.
    """

    def __init__(
        self, spec: RuntimeSpec, *, max_waiting: int, crashes: CrashWindow | None = None
    ) -> None:
        self.spec = spec
        self.max_waiting = max_waiting
        self.keep_alive = spec.keep_alive
        self.defaults = spec.defaults
        self._crashes = crashes or CrashWindow()
        self._lock = threading.Lock()
        self._jobs: dict[str, TrackedJob] = {}  # in submission order
        self._runtime: RuntimeLink | None = None
        self._state_name = STARTING
        self._latest: RuntimeState | None = None
        self._loads_before = 0  # pairs loaded by runtimes that died
        self._restarts = 0
        self._last_death: str | None = None
        self._stopped_reason: str | None = None
        self._accepting = True
        self._stopping = False
        self._completed = self._cancelled = self._failed = 0
        self._idle_since: float | None = time.monotonic()
        self._asks: dict[int, tuple[threading.Event, list[SchedulerSnapshot]]] = {}
        self._ask_ids = itertools.count()

    # -- the queue ---------------------------------------------------------------

    def start(self) -> None:
        """Start the runtime; with a preload (``serve --pair``), wait until it is ready.

        Without one the engine listens at once, as before (a front end waits for it):
        jobs wait here until the runtime is up. Raises
        :class:`~app.errors.DraftpenError` when the first preload fails (a pair that is
        not there, a worker down), as an engine in one process does."""
        runtime = self._spawn(self.spec)
        if self.spec.preload is None:
            return
        runtime.ready.wait()
        if runtime.preload_error is not None:
            raise DraftpenError(runtime.preload_error)

    def submit(self, job: EngineJob) -> EngineJob:
        """Queue a job; it goes to the runtime now, or once it is back."""
        restart: RuntimeSpec | None = None
        with self._lock:
            if not self._accepting:
                raise ShuttingDownError
            if self._state_name == STOPPED:
                if job.prepare is not None or job.inspect is not None:
                    raise RuntimeStoppedError(self._stopped_reason or "The runtime stopped.")
                # A load asks for the runtime again: a person (or a front end) has
                # heard why it stopped.
                self._crashes.clear()
                self._stopped_reason = None
                self._state_name = RESTARTING
                restart = self._next_spec()
            slots = self._latest.queue.parallel if self._latest else (self.defaults.parallel or 1)
            if len(self._jobs) > self.max_waiting + max(0, slots - 1):
                raise QueueFullError
            tracked = TrackedJob(job)
            self._jobs[job.id] = tracked
            self._idle_since = None
            runtime = self._runtime
            # RUNNING is set under this lock as the jobs held here go out (_ready):
            # a job either goes now or with them.
            if runtime is not None and self._state_name == RUNNING:
                self._send_job(runtime, tracked)
        if restart is not None:
            self._spawn(restart)
        return job

    def cancel(self, job: EngineJob, reason: str) -> None:
        """Stop a job: the runtime cancels it (waiting: at once; running: at the loop's
        next round); one not sent yet (the runtime is being started) ends here."""
        with self._lock:
            tracked = self._jobs.get(job.id)
            if tracked is None or job.cancel_event.is_set():
                return
            job.cancel_reason = reason
            job.cancel_event.set()
            runtime = self._runtime
            if tracked.sent and runtime is not None:
                self._send(runtime, CancelJob(job.id, reason))
                return
            del self._jobs[job.id]
            self._cancelled += 1
            self._note_idle()
        logger.info("%s: cancelled while queued (%s)", job.id, reason)
        tracked.end_cancelled()

    def shutdown(self, reason: str = "server shutting down") -> None:
        """Take no new jobs, cancel every job, and stop the runtime."""
        with self._lock:
            if self._stopping:
                return  # uvicorn's shutdown, then the server's: once is enough
            self._accepting = False
            self._stopping = True
            jobs = [tracked.job for tracked in self._jobs.values()]
        for job in jobs:
            self.cancel(job, reason)
        with self._lock:
            runtime = self._runtime
            if runtime is not None and self._state_name != STOPPED:
                self._send(runtime, StopRuntime(reason))

    def join(self, timeout: float) -> bool:
        """Wait for the runtime to exit after :meth:`shutdown`; one that does not
        within ``timeout`` is killed (it is ours). False if it had to be."""
        with self._lock:
            runtime = self._runtime
        return runtime is None or runtime.join(timeout)

    def state(self) -> QueueState:
        """The queue as the front sees it: the runtime's running jobs, and every job
        that waits (in the runtime's queue, or here while it is started again)."""
        with self._lock:
            latest = self._latest.queue if self._latest is not None else None
            alive = self._state_name == RUNNING and latest is not None
            waiting = sum(1 for tracked in self._jobs.values() if not tracked.taken)
            return QueueState(
                running=latest.running if alive and latest else None,
                running_label=latest.running_label if alive and latest else None,
                running_count=latest.running_count if alive and latest else 0,
                parallel=latest.parallel if latest else (self.defaults.parallel or 1),
                parallel_refusal=latest.parallel_refusal if latest else None,
                waiting=waiting,
                limit=self.max_waiting,
                completed=self._completed,
                cancelled=self._cancelled,
                failed=self._failed,
                accepting=self._accepting,
                idle_since=self._idle_since,
            )

    # -- the pairs held ----------------------------------------------------------

    @property
    def loads(self) -> int:
        """Pairs loaded since the engine started, by every runtime."""
        with self._lock:
            return self._loads_before + (self._latest.loads if self._latest else 0)

    def loaded_name(self) -> str | None:
        """The pair the runtime holds, as it last said."""
        with self._lock:
            held = self._latest.held if self._latest is not None else None
        return held[0] if held is not None else None

    def options_for(self, name: str) -> LoadOptions:
        """How ``name`` is held now, or would be loaded on demand."""
        with self._lock:
            latest = self._latest
        if latest is not None:
            if latest.held is not None and latest.held[0] == name:
                return latest.held[1]
            if name in latest.remembered:
                return latest.remembered[name]
        return self.spec.remembered.get(name, self.defaults)

    def snapshot(self) -> SchedulerSnapshot:
        """What the runtime holds (asked of it; blocking, so off the event loop)."""
        with self._lock:
            runtime = self._runtime
            latest = self._latest
            running = runtime is not None and self._state_name == RUNNING
            if running and runtime is not None:
                ask_id = next(self._ask_ids)
                waiter: tuple[threading.Event, list[SchedulerSnapshot]] = (threading.Event(), [])
                self._asks[ask_id] = waiter
                self._send(runtime, AskSnapshot(ask_id))
        if running:
            answered = waiter[0].wait(_SNAPSHOT_SECONDS)
            with self._lock:
                self._asks.pop(ask_id, None)
            if answered and waiter[1]:
                return waiter[1][0]
        return SchedulerSnapshot((), latest.loading if latest is not None else None)

    def report(self) -> RuntimeReport:
        """The runtime's state for ``GET /health``."""
        with self._lock:
            runtime = self._runtime
            return RuntimeReport(
                state=self._state_name,
                pid=runtime.pid if runtime is not None else None,
                restarts=self._restarts,
                last_death=self._last_death,
                stopped_reason=self._stopped_reason,
            )

    # -- the runtime process -----------------------------------------------------

    def _spawn(self, spec: RuntimeSpec) -> RuntimeLink:
        """Start a runtime process; its messages come to :meth:`_receive`."""
        runtime = RuntimeLink(spec, self._receive, self._runtime_ended)
        with self._lock:
            self._runtime = runtime
            if self._state_name != RESTARTING:
                self._state_name = STARTING
        return runtime

    def _next_spec(self) -> RuntimeSpec:
        """The spec of the next runtime: the pair the last one held, and its options,
        and every --target/--draft pair this front knows (clients' loads added some)."""
        latest = self._latest
        # The front's own list (serve's pair, and those clients' loads added): a pair a
        # client shared must outlive the runtime that loaded it, or the next would not
        # find the pair it preloads or a chat names.
        spec = dataclasses.replace(self.spec, command_line_pairs=command_line_pairs())
        if latest is None:
            return spec
        preload = latest.held if latest.loading is None else None
        remembered = {**self.spec.remembered, **latest.remembered}
        return dataclasses.replace(spec, preload=preload, remembered=remembered)

    def _send(self, runtime: RuntimeLink, message: object) -> None:
        """Send ``message`` to ``runtime`` (lock held: one writer at a time)."""
        runtime.send(message)

    def _send_job(self, runtime: RuntimeLink, tracked: TrackedJob) -> None:
        """Send a job's runtime half (lock held)."""
        self._send(runtime, tracked.submit_message())

    def _receive(self, runtime: RuntimeLink, message: object) -> None:
        if isinstance(message, JobItem):
            self._deliver(message)
        elif isinstance(message, RuntimeState):
            with self._lock:
                self._latest = message
        elif isinstance(message, JobTaken):
            with self._lock:
                tracked = self._jobs.get(message.id)
                if tracked is not None:
                    tracked.taken = True
        elif isinstance(message, SnapshotAnswer):
            with self._lock:
                waiter = self._asks.get(message.ask_id)
                latest = self._latest
                if not message.snapshot.loaded and latest is not None and latest.held:
                    # Fresher than the state that follows it in the same batch (a pair
                    # just unloaded): /v1/models must not say loaded once /health says not.
                    self._latest = dataclasses.replace(latest, held=None)
            if waiter is not None:
                waiter[1].append(message.snapshot)
                waiter[0].set()
        elif isinstance(message, RuntimeReady):
            self._ready(runtime, message)

    def _ready(self, runtime: RuntimeLink, message: RuntimeReady) -> None:
        """The runtime takes jobs: send it every job that waits here, in order."""
        if message.preload_error is not None:
            logger.warning("the runtime started without its pair: %s", message.preload_error)
        with self._lock:
            runtime.pid = message.pid
            runtime.preload_error = message.preload_error
            if self._runtime is runtime and not self._stopping:
                self._state_name = RUNNING
                for tracked in self._jobs.values():
                    if not tracked.sent:
                        self._send_job(runtime, tracked)
        runtime.ready.set()

    def _deliver(self, message: JobItem) -> None:
        """A job's item, as its handler reads it."""
        with self._lock:
            tracked = self._jobs.get(message.id)
            if tracked is None:
                return  # ended here already (the runtime died, or a cancel)
            if isinstance(message.item, JobEnd):
                del self._jobs[message.id]
                self._count(tracked.outcome())
                self._note_idle()
        tracked.deliver(message.item)

    def _count(self, outcome: str) -> None:
        """Count a job that ended (lock held)."""
        if outcome == FAILED:
            self._failed += 1
        elif outcome == CANCELLED:
            self._cancelled += 1
        else:
            self._completed += 1

    def _note_idle(self) -> None:
        """Idle from now, if no job is left (lock held)."""
        if not self._jobs:
            self._idle_since = time.monotonic()

    def _runtime_ended(self, runtime: RuntimeLink) -> None:
        """The runtime's pipe closed: a stop we asked for, or a death to answer."""
        exitcode = runtime.exitcode
        pid = runtime.pid
        with self._lock:
            if self._runtime is not runtime:
                return
            stopping = self._stopping
        runtime.ready.set()  # nobody waits for a runtime that is gone
        if stopping:
            with self._lock:
                self._state_name = STOPPED
                left = list(self._jobs.values())
                self._jobs.clear()
                self._cancelled += len(left)
            for tracked in left:  # the runtime ended before their end came back
                tracked.end_cancelled()
            return
        why = death_reason(self.spec.record_path, pid, exitcode)
        logger.warning("the engine's runtime process died: %s", why)
        lost: list[TrackedJob] = []
        ended: list[TrackedJob] = []
        with self._lock:
            self._last_death = why
            if self._latest is not None:
                self._loads_before += self._latest.loads
            again = self._crashes.add()
            for job_id, tracked in list(self._jobs.items()):
                if tracked.taken or not again:
                    lost.append(tracked)
                elif tracked.job.cancel_event.is_set():
                    ended.append(tracked)
                else:
                    tracked.sent = False  # it waited: the next runtime gets it
                    continue
                del self._jobs[job_id]
            self._failed += len(lost)
            self._cancelled += len(ended)
            self._note_idle()
            if again:
                self._state_name = RESTARTING
                self._restarts += 1
                spec = self._next_spec()
            else:
                self._state_name = STOPPED
                self._stopped_reason = stopped_reason(self._crashes, why)
            if self._latest is not None:  # nothing runs or is held until the next says
                preload = spec.preload if again else None
                self._latest = dataclasses.replace(
                    self._latest,
                    queue=_idle(self._latest.queue),
                    held=None,
                    loading=preload[0] if preload is not None else None,
                    loads=0,
                )
        reason = self._stopped_reason or ""
        error = restarted_error(why) if again else runtime_stopped_error(reason)
        for tracked in lost:
            tracked.end_with(error)
        for tracked in ended:
            tracked.end_cancelled()
        if again:
            logger.info("starting the engine's runtime again (%d restarts)", self._restarts)
            self._spawn(spec)
        else:
            logger.warning("%s", self._stopped_reason)


def _idle(queue: QueueState) -> QueueState:
    """``queue`` with nothing running (its runtime is gone)."""
    return dataclasses.replace(queue, running=None, running_label=None, running_count=0)
