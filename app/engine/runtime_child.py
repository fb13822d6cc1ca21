"""The engine's runtime process: the loaded pair, THE loop and the caches, nothing else.

Started by the front process (``runtime_supervisor``) with a :class:`RuntimeSpec`, it
runs the same :class:`~app.engine.queue.GenerationQueue` and
:class:`~app.engine.scheduler.PairScheduler` an engine in one process runs, so every
job is loaded, prepared and generated exactly as before; only its items go to the
front over the pipe instead of to an event loop (``runtime_wire``). Its main thread
reads the front's messages; a sender thread writes what the jobs post, gathered into
one message while the pipe was busy, so the loop's thread never waits on the front.

llama.cpp and MLX may abort this process (a lost RPC worker, an assert, a GPU out of
memory): it keeps its own crash record (``<socket>.runtime.activity`` and ``.fatal``)
for the front to read, and it ends when the front goes away (its pipe closes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from app.client.wire import waiting_label
from app.engine import crash_record
from app.engine.generation_run import END
from app.engine.http_errors import generation_error
from app.engine.job_requests import PreparedGeneration
from app.engine.jobs import Prepared
from app.engine.queue import GenerationQueue
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
    SubmitJob,
    TokenBytes,
)
from app.engine.scheduler import PairScheduler
from app.engine.schema import ApiError
from app.models.catalog_file import remember_command_line_pair, restore_command_line_pairs
from backends.engine import Engine
from backends.generation_events import GenerationEvent

logger = logging.getLogger("draftpen.server")

# The front bounds the queue (it answers 503); the runtime takes whatever it is sent.
_UNBOUNDED = 1 << 30
# How long a stop waits for the generation in progress to reach its next round.
_STOP_SECONDS = 30.0
# How often a wait for a message to be written looks whether the sender still runs.
_FLUSH_SECONDS = 1.0


def run_runtime(connection: Connection, spec: RuntimeSpec) -> None:
    """The runtime process's main: serve the front's jobs until it stops or goes."""
    # Ctrl+C at a terminal, `timeout`, and systemd's stop (KillMode=control-group) signal
    # the whole group: the front decides, and stops this process itself (StopRuntime),
    # or it ends when the front's pipe closes. SIGKILL still ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _log_to_stderr()
    if spec.log_path is not None:
        from app.engine.log_file import follow_log

        follow_log(spec.log_path)
    if spec.record_path is not None:
        crash_record.start_recording(spec.record_path, spec.runtime)
    # Spawned, this process has none of the front's --target/--draft pairs.
    restore_command_line_pairs(spec.command_line_pairs)
    scheduler = spec.build(spec)
    scheduler.remember(spec.remembered)
    queue = GenerationQueue(scheduler, max_waiting=_UNBOUNDED)
    outbox = Outbox(connection, lambda: _state(queue, scheduler))
    # The front learns that a job was taken before the runtime starts on it: a load or a
    # prompt that kills the runtime then costs that job's reply, and is not sent again.
    queue.on_taken = lambda job: outbox.put(JobTaken(job.id), wait=True)
    queue.on_change = outbox.changed
    outbox.start()
    queue.start()
    preload_error = _preload(queue, scheduler, spec)
    outbox.put(RuntimeReady(os.getpid(), preload_error))
    outbox.changed()
    reason = _serve(connection, queue, scheduler, outbox)
    queue.shutdown(reason)
    stopped = queue.join(_STOP_SECONDS)
    if stopped:
        scheduler.unload("the engine stopped")
    outbox.close()
    crash_record.stop_recording()
    # A generation stuck in one long call still uses the models: leave them to the exit.
    os._exit(0)


def _serve(
    connection: Connection, queue: GenerationQueue, scheduler: PairScheduler, outbox: Outbox
) -> str:
    """Read the front's messages until it says stop (or goes); why it stopped."""
    jobs: dict[str, RuntimeJob] = {}
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return "the engine's front process went away"
        except Exception as error:  # a message that does not unpickle here: a bug
            logger.warning("unreadable message from the engine's front: %r", error)
            continue
        if isinstance(message, SubmitJob):
            if message.command_line_pair is not None:
                # Before the job waits in the queue: its load then finds the pair.
                remember_command_line_pair(message.command_line_pair)
            job = RuntimeJob.of(message, outbox, jobs)
            jobs[job.id] = job
            queue.submit(job)  # type: ignore[arg-type]  # an EngineJob to the queue
        elif isinstance(message, CancelJob):
            cancelled = jobs.get(message.id)
            if cancelled is not None:
                queue.cancel(cancelled, message.reason)  # type: ignore[arg-type]
        elif isinstance(message, AskSnapshot):
            outbox.put(SnapshotAnswer(message.ask_id, scheduler.snapshot()))
        elif isinstance(message, StopRuntime):
            return message.reason


def _preload(queue: GenerationQueue, scheduler: PairScheduler, spec: RuntimeSpec) -> str | None:
    """Load ``spec.preload`` on the worker thread; the error's text if it failed."""
    if spec.preload is None:
        return None
    name, options = spec.preload

    def progress(line: str) -> None:
        print(f"draftpen serve: {line}", file=sys.stderr, flush=True)

    try:
        queue.run_on_worker(lambda: scheduler.acquire(name, options, progress))
    except Exception as error:  # said to the front; the runtime serves on without it
        logger.warning("could not load %s: %s", name, error)
        return str(error)
    return None


def _state(queue: GenerationQueue, scheduler: PairScheduler) -> RuntimeState:
    return RuntimeState(
        queue=queue.state(),
        held=scheduler.held(),
        loading=scheduler.loading_name(),
        remembered=scheduler.remembered(),
        loads=scheduler.loads,
    )


def _log_to_stderr() -> None:
    """draftpen's log lines on stderr, as the front's uvicorn configuration has them."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    draftpen = logging.getLogger("draftpen")
    draftpen.addHandler(handler)
    draftpen.setLevel(logging.INFO)
    draftpen.propagate = False


@dataclass(eq=False)
class RuntimeJob:
    """A job in the runtime's queue, standing for the front's ``EngineJob``: what it
    posts goes to the front, as plain data."""

    id: str
    pair: str
    kind: str
    outbox: Outbox
    jobs: dict[str, RuntimeJob]
    generation: Callable[[Engine], PreparedGeneration] | None = None
    load_options: Any = None
    inspect: Callable[[Engine], Any] | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    submitted: float = 0.0
    last_notice: object = None
    prompt_tokens: int = 0
    # The target's token_bytes, when the job asked for logprobs, and the tokens whose
    # bytes the front already has.
    _token_bytes: Callable[[int], bytes] | None = None
    _sent_bytes: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, message: SubmitJob, outbox: Outbox, jobs: dict[str, RuntimeJob]) -> RuntimeJob:
        """The runtime's job for a :class:`SubmitJob` from the front."""
        return cls(
            id=message.id,
            pair=message.pair,
            kind=message.kind,
            outbox=outbox,
            jobs=jobs,
            generation=message.generation,
            load_options=message.load_options,
            inspect=message.inspect,
            submitted=time.monotonic(),
        )

    @property
    def label(self) -> str:
        """How this job shows in another's queue notice."""
        return waiting_label(self.kind, self.pair)

    @property
    def prepare(self) -> Callable[[Engine], Prepared] | None:
        """The queue's ``prepare``: the generation built here, its extras the
        :class:`PreparedGeneration` the front makes its answer's format from."""
        if self.generation is None:
            return None
        return self._prepare

    def _prepare(self, engine: Engine) -> Prepared:
        assert self.generation is not None
        prepared = self.generation(engine)
        if prepared.inputs.logprobs:
            self._token_bytes = engine.target.token_bytes
        return Prepared(prepared.request, prepared)

    def post(self, item: object) -> None:
        """Send an item to the front (any thread)."""
        if item is END:
            self.jobs.pop(self.id, None)
            self.outbox.put(JobItem(self.id, JobEnd()))
            return
        if isinstance(item, Prepared):
            item = item.extras  # the request stays here; the front needs its inputs
        elif isinstance(item, GenerationEvent) and self._token_bytes is not None:
            self._send_token_bytes(item)
        elif isinstance(item, BaseException):
            item = generation_error(item)  # an ApiError, which pickles whole
        self.outbox.put(JobItem(self.id, item))

    def _send_token_bytes(self, event: GenerationEvent) -> None:
        assert self._token_bytes is not None
        table: dict[int, bytes] = {}
        for entry in event.token_logprobs:
            for token in (entry.token, *(token for token, _ in entry.top)):
                if token not in self._sent_bytes:
                    table[token] = self._token_bytes(token)
                    self._sent_bytes.add(token)
        if table:
            self.outbox.put(JobItem(self.id, TokenBytes(table)))


def pickled(batch: list[object]) -> bytes:
    """``batch`` pickled; any item that does not pickle is replaced by an error for its
    job (a bug, but one that must not stop every other job's stream)."""
    try:
        return pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)
    except Exception:
        pass
    kept: list[object] = []
    for message in batch:
        try:
            pickle.dumps(message)
            kept.append(message)
        except Exception as error:
            logger.warning("cannot send %r to the front: %s", message, error)
            if isinstance(message, JobItem):
                failure = ApiError(
                    500,
                    f"The engine's runtime could not send a reply's item ({error}).",
                    error_type="server_error",
                    code="internal_error",
                )
                kept.append(JobItem(message.id, failure))
    return pickle.dumps(kept, pickle.HIGHEST_PROTOCOL)


class Outbox:
    """Messages to the front, written by one sender thread, several to a write (a
    pickled list: the front reads it with ``pickle.loads(recv_bytes())``).

    :meth:`put` only appends (the loop's threads never wait on the pipe); a state
    change is noted with :meth:`changed` and sent as one :class:`RuntimeState` after
    the messages gathered with it."""

    def __init__(self, connection: Connection, state: Callable[[], RuntimeState]) -> None:
        self._connection = connection
        self._state = state
        self._condition = threading.Condition()
        self._messages: list[object] = []
        self._dirty = False
        self._closed = False
        self._queued = 0  # messages put, and of those written (in order)
        self._written = 0
        self._thread = threading.Thread(target=self._send, name="draftpen-runtime-out", daemon=True)

    def start(self) -> None:
        """Start the sender thread."""
        self._thread.start()

    def put(self, message: object, *, wait: bool = False) -> None:
        """Queue a message for the front (any thread, any lock held); with ``wait``
        (no lock held), return once it is written."""
        with self._condition:
            self._messages.append(message)
            self._queued += 1
            number = self._queued
            self._condition.notify_all()
            while wait and self._written < number and not self._closed:
                self._condition.wait(_FLUSH_SECONDS)
                if not self._thread.is_alive():
                    return  # the front is gone: nobody to tell

    def changed(self) -> None:
        """The queue's or the scheduler's state may have changed (any lock held)."""
        with self._condition:
            self._dirty = True
            self._condition.notify_all()

    def close(self) -> None:
        """Send what is left, then stop the sender."""
        with self._condition:
            self._closed = True
            self._condition.notify()
        self._thread.join(10.0)

    def _send(self) -> None:
        while True:
            with self._condition:
                while not (self._messages or self._dirty or self._closed):
                    self._condition.wait()
                batch, self._messages = self._messages, []
                dirty, self._dirty = self._dirty, False
                closed = self._closed
                taken = self._queued
            if dirty:
                # Outside the outbox's lock: the state takes the queue's.
                batch.append(self._state())
            if batch:
                try:
                    self._connection.send_bytes(pickled(batch))
                except (OSError, ValueError):
                    return  # the front is gone: the main thread sees its pipe close
            with self._condition:
                self._written = taken
                self._condition.notify_all()
            if closed:
                with self._condition:
                    if not self._messages:
                        with contextlib.suppress(OSError):
                            self._connection.close()
                        return
