"""When a wait on a worker has lasted too long, and which worker it waits on.

A worker whose process hangs (stopped, or stuck in its GPU driver) while its machine
stays up leaves llama.cpp's RPC client waiting forever: its kernel acknowledges every
packet, so TCP keepalive never gives up. This module decides, from facts gathered by
``watchdog``, when the engine stops waiting and which connection to break:

- **How long a forward pass may take.** The split target's runtime calls are timed
  (:class:`RuntimeCalls`); a call of ``n`` tokens may take ``FACTOR`` times the slowest
  recent call of its kind (a decode or verify of fewer than ``CHUNK`` tokens; or a
  prompt chunk, by its slowest pace per token times ``n``), and never less than the
  floor (the ``worker_timeout`` setting, 30 s by default). Ten times the slowest
  recent call leaves room for a longer context, another program's load and the
  network's bad moments; the floor keeps the first slow call of a fast machine from
  being called a hang. Before any call was timed, and for a wait outside a timed call
  (a state save, a load), the bound is ``FIRST_FACTOR`` times the floor.
- **Which worker.** Only a connection the engine waits on (a thread of this process
  blocked reading or writing it) that has sent nothing for the whole bound: a worker
  that answers, however slowly, is moving, and one nobody waits on is not the cause.
  Where the system cannot tell whether a thread waits on it, a request it has not
  answered stands in; where it can tell neither that nor the silence, every worker
  connection counts (the engine would otherwise wait forever).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from backends.workers.endpoints import Endpoint

FACTOR = 10.0
FIRST_FACTOR = 10.0
CHUNK = 32  # tokens: at least this many is a prompt chunk, timed by its pace per token
WINDOW = 64  # the recent calls remembered
DEFAULT_FLOOR = 30.0


@dataclass(frozen=True)
class Call:
    """A runtime call in flight: its tokens and when it started (``time.monotonic``)."""

    tokens: int
    started: float


class Pace:
    """The split target's recent runtime calls, and how long the next may take."""

    def __init__(self, window: int = WINDOW) -> None:
        self._recent: deque[tuple[int, float]] = deque(maxlen=window)

    def observe(self, tokens: int, seconds: float) -> None:
        """A call of ``tokens`` took ``seconds``."""
        self._recent.append((max(1, tokens), seconds))

    def expected(self, tokens: int) -> float | None:
        """About the longest a call of ``tokens`` took lately; None before any call.

        Small calls (decodes, verifies) cost about the same whatever their size, so the
        slowest of them; a prompt chunk costs by its tokens, so the slowest pace per
        token of the chunks. Lacking the kind asked about, the other kind stands in,
        scaled so that it errs long: a chunk of CHUNK tokens takes at least what any
        smaller call does, and no token of a chunk takes longer than a whole small call.
        """
        small = [seconds for count, seconds in self._recent if count < CHUNK]
        pace = [seconds / count for count, seconds in self._recent if count >= CHUNK]
        if tokens < CHUNK:
            if small:
                return max(small)
            return max(pace) * CHUNK if pace else None
        if pace:
            return max(pace) * tokens
        return max(small) * tokens if small else None

    def bound(self, tokens: int, floor: float) -> float:
        """Seconds a call of ``tokens`` may wait before a worker is called hung."""
        expected = self.expected(tokens)
        if expected is None:
            return floor * FIRST_FACTOR
        return max(floor, FACTOR * expected)


class RuntimeCalls:
    """The split target's runtime calls in flight, and their :class:`Pace`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[int, Call] = {}  # thread -> its call
        self.pace = Pace()

    @contextlib.contextmanager
    def timing(self, tokens: int) -> Iterator[None]:
        """Time the block as one runtime call of ``tokens``."""
        thread = threading.get_ident()
        started = time.monotonic()
        with self._lock:
            self._in_flight[thread] = Call(tokens, started)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight.pop(thread, None)
                self.pace.observe(tokens, time.monotonic() - started)

    def oldest(self) -> Call | None:
        """The call in flight longest, if any."""
        with self._lock:
            return min(self._in_flight.values(), key=lambda call: call.started, default=None)

    def bound(self, call: Call, floor: float) -> float:
        """Seconds ``call`` may wait before a worker is called hung."""
        with self._lock:
            return self.pace.bound(call.tokens, floor)


@dataclass(frozen=True)
class Connection:
    """What the watchdog could learn of one connection to a worker (None: cannot tell)."""

    endpoint: Endpoint
    fd: int
    waited_on: bool | None = None  # a thread of this process blocked reading or writing it
    silent_for: float | None = None  # seconds since the worker last sent data on it
    unanswered: bool | None = None  # data sent to it since it last sent any


def hung(
    connections: Iterable[Connection], bound: float, *, timed: bool = True
) -> list[Connection]:
    """The connections whose worker hangs, the engine having waited ``bound`` seconds.

    ``timed``: a timed runtime call is past its bound (the wait is known to be too long
    whatever the connections show); otherwise only a connection a thread is seen
    waiting on can be blamed.
    """
    found = []
    for connection in connections:
        if connection.silent_for is not None and connection.silent_for < bound:
            continue  # it spoke within the bound: slow, perhaps, but moving
        if connection.waited_on is not None:
            blamed = connection.waited_on
        elif not timed:
            blamed = False
        elif connection.unanswered is not None:
            blamed = connection.unanswered
        else:
            blamed = True  # nothing to tell it by, and the call waits past its bound
        if blamed:
            found.append(connection)
    return found


def why(silent_for: float | None, waited: float) -> str:
    """The crash record's words for a worker found hung."""
    seconds = silent_for if silent_for is not None else waited
    return (
        f"did not answer for {seconds:.0f} s while the engine waited on it (its process may "
        "be stopped or stuck, e.g. in its GPU driver; the worker_timeout setting sets the wait)"
    )
