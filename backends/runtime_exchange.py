"""Where generation threads hand runtime work to the one thread that runs it.

Several sequences generate at once, each on a thread of its own (its loop, sampling,
drafting decisions), but llama.cpp's OpenMP build wants ONE thread per process to run
its graphs (see ``backends/llamacpp/library.py``), and the sequences' forwards should
be one batched decode, not several. So a generation thread never runs the runtime: it
hands its decode to a :class:`GathersDecodes` (the runtime's batcher) or any other
runtime call to :meth:`RuntimeExchange.call`, and waits. The runtime thread (the
engine's queue worker, or :meth:`RuntimeExchange.serve` in a thread of its own) takes
the work: calls first, then every batcher whose batch is ready.

One condition guards all of it; the queue's worker shares it, so a decode wakes the
worker whatever else it waits for.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class GathersDecodes(Protocol):
    """A runtime's batcher: it says when its gathered decodes are ready to run."""

    def ready_work(self, now: float) -> tuple[Callable[[], None] | None, float | None]:
        """The work that runs the ready batch, or None and when to look again
        (None: only when something is submitted). Called with the condition held."""
        ...


# A batch waits for the generating sequences still on their way at most this share of
# the last batch's time, and never longer than MAX_GRACE seconds: a sequence busy with
# host work (sampling, a grammar) delays the others by little, a lone one not at all.
GRACE_SHARE = 0.25
MAX_GRACE = 0.02
SMOOTHING = 0.3


class GatheringBatcher:
    """What every runtime's batcher shares: which sequences are generating (a batch waits
    for them), the grace it waits at most, and how long its batches took. A subclass
    keeps its pending work and decides what one batch takes."""

    def __init__(
        self, condition: threading.Condition, arriving: Callable[[], bool] | None = None
    ) -> None:
        self.condition = condition
        # Whether a request is on its way to a sequence (RuntimeExchange.arriving).
        self._arriving = arriving or (lambda: False)
        self._generating: set[int] = set()
        self._pending: list[Any] = []  # the subclass's requests, oldest first
        self._last_seconds = 0.0
        self._last_end = 0.0
        self.runs = 0  # batches run (none yet: the longest grace)

    def generating(self, seq: int, active: bool) -> None:
        """Say whether ``seq`` is generating: a batch waits for generating sequences."""
        with self.condition:
            if active:
                self._generating.add(seq)
            else:
                self._generating.discard(seq)
            self.condition.notify_all()

    def generating_count(self) -> int:
        """How many sequences are generating (they share each forward)."""
        return len(self._generating)

    def hand_over(self, request: Any) -> None:
        """Queue ``request`` (a subclass's, with ``done`` and ``error``) for the runtime
        thread and wait until it is done; raise what it raised (condition not held)."""
        with self.condition:
            self._pending.append(request)
            self.condition.notify_all()
            while not request.done:
                self.condition.wait()
        if request.error is not None:
            raise request.error

    def others_busy(self, mine: set[int]) -> bool:
        """Whether a sequence not in ``mine`` is generating (between its rounds, or
        setting up), or a request is on its way to one (condition held): then a long
        prompt reads in short pieces, so they do not wait for a chunk of it."""
        return bool(self._generating - mine) or self._arriving()

    def waiting_for(self, pending: set[int]) -> set[int]:
        """The generating sequences that have not submitted yet (condition held)."""
        return self._generating - pending

    def due(self, oldest_arrived: float) -> float:
        """When a batch whose oldest work came at ``oldest_arrived`` stops waiting. The
        grace counts from when the runtime was free to run it: work that came while
        another batch ran waits for that batch's sequences to come back."""
        grace = min(MAX_GRACE, GRACE_SHARE * self._last_seconds) if self.runs else MAX_GRACE
        return max(oldest_arrived, self._last_end) + grace

    def ran(self, seconds: float) -> None:
        """Count a batch that took ``seconds`` (condition held)."""
        self._last_seconds = seconds
        self._last_end = time.monotonic()
        self.runs += 1


def smoothed(last: float | None, measured: float) -> float:
    """``measured`` folded into the running figure ``last`` (the first one as it is)."""
    return measured if last is None else last + SMOOTHING * (measured - last)


class RuntimeExchange:
    """Runtime work handed from generation threads to the runtime thread."""

    def __init__(self, condition: threading.Condition | None = None) -> None:
        self.condition = condition or threading.Condition()
        self._calls: deque[tuple[Callable[[], object], Future[object]]] = deque()
        self._batchers: list[GathersDecodes] = []
        self._runtime_thread: int | None = None
        # Whether a request is on its way to a sequence (condition held): set by the
        # engine's queue. Batchers keep long prompts' batches short meanwhile, so the
        # newcomer's setup does not wait a whole chunk of someone else's prompt.
        self.arriving: Callable[[], bool] = lambda: False

    def bind(self) -> None:
        """Make the calling thread the runtime thread."""
        self._runtime_thread = threading.get_ident()

    def on_runtime_thread(self) -> bool:
        """Whether the calling thread is the runtime thread."""
        return threading.get_ident() == self._runtime_thread

    def add_batcher(self, batcher: GathersDecodes) -> None:
        """Let the runtime thread run ``batcher``'s batches."""
        with self.condition:
            self._batchers.append(batcher)

    def remove_batcher(self, batcher: GathersDecodes) -> None:
        """Stop looking at ``batcher`` (its context is being freed)."""
        with self.condition:
            if batcher in self._batchers:
                self._batchers.remove(batcher)

    def call(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the runtime thread (at once if this is it); its result or error."""
        if self.on_runtime_thread():
            return work()
        return self.submit(work).result()

    def submit(self, work: Callable[[], T]) -> Future[T]:
        """Hand ``work`` to the runtime thread; its future. (The condition may be held:
        a caller can check, under it, that the runtime thread will still take work.)"""
        future: Future[T] = Future()
        with self.condition:
            self._calls.append((work, future))  # type: ignore[arg-type]
            self.condition.notify_all()
        return future

    def has_calls(self) -> bool:
        """Whether a call waits (condition held)."""
        return bool(self._calls)

    def next_work(self, now: float) -> tuple[Callable[[], None] | None, float | None]:
        """The next piece of work to run, else the time to look again (None: when
        notified). Called by the runtime thread with the condition held."""
        if self._calls:
            work, future = self._calls.popleft()
            return lambda: _settle(future, work), None
        wake_at: float | None = None
        for batcher in self._batchers:
            ready, at = batcher.ready_work(now)
            if ready is not None:
                return ready, None
            if at is not None:
                wake_at = at if wake_at is None else min(wake_at, at)
        return None, wake_at

    def serve(self, stop: threading.Event) -> None:
        """Be the runtime thread until ``stop`` is set (tests, one-process programs)."""
        self.bind()
        while True:
            with self.condition:
                while True:
                    if stop.is_set():
                        return
                    work, wake_at = self.next_work(time.monotonic())
                    if work is not None:
                        break
                    timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
                    self.condition.wait(timeout if timeout is not None else 0.5)
            work()

    def stop_serving(self, stop: threading.Event) -> None:
        """Make :meth:`serve` return."""
        with self.condition:
            stop.set()
            self.condition.notify_all()


# Threads that run a runtime's forward beside the work of the thread that runs the rest
# (a split target's verify while the draft model drafts, backends/speculation/overlap.py).
_beside = threading.local()


@contextlib.contextmanager
def computing_beside() -> Iterator[None]:
    """Mark the calling thread, for the block, as computing beside the runtime thread.

    A runtime then computes its graphs there on one thread of its own: llama.cpp's OpenMP
    build slows every graph of the process once two threads each lead a team (see
    ``backends/llamacpp/library.py``), and a forward that mostly waits on the network
    needs no team.
    """
    _beside.active = True
    try:
        yield
    finally:
        _beside.active = False


def is_computing_beside() -> bool:
    """Whether the calling thread is inside :func:`computing_beside`."""
    return getattr(_beside, "active", False)


def _settle(future: Future[object], work: Callable[[], object]) -> None:
    """Run ``work`` and hand its result or error to the waiting thread."""
    try:
        future.set_result(work())
    except BaseException as error:  # handed to the caller, who re-raises it
        future.set_exception(error)
