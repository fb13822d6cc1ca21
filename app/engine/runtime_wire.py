"""What crosses between the engine's front process and its runtime process.

``draftpen serve`` is two processes (docs/engine-api.md, "The engine's runtime"): the
front holds the sockets, the dialects, the queue's bookkeeping and every client's
stream; the runtime holds the loaded pair, THE loop and the caches in RAM. They speak
over one ``multiprocessing`` pipe, in pickled messages of the dataclasses below:

- front -> runtime: :class:`SubmitJob` (a request's runtime half: plain data, never a
  closure over the HTTP handler), :class:`CancelJob`, :class:`AskSnapshot` (for
  ``/health``), :class:`StopRuntime`;
- runtime -> front: lists of messages, gathered while the pipe was busy, so a round of
  several sequences' events costs one write: :class:`RuntimeReady`,
  :class:`JobTaken` (the runtime's worker took the job: from now on a death of the
  runtime costs its reply), :class:`JobItem` (a job's notice, prepared request,
  event, error or end), :class:`RuntimeState` (the queue and the pair held) and
  :class:`SnapshotAnswer`.

Nothing here is per token beyond the events the loop yields today; nothing waits for
an answer on the way of a reply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engine.jobs import QueueState
from app.engine.scheduler import LoadOptions, SchedulerSnapshot
from app.models.catalog import Catalog

if TYPE_CHECKING:
    from app.engine.scheduler import PairScheduler
    from backends.engine import Engine


@dataclass(frozen=True)
class RuntimeSpec:
    """How to start a runtime process: everything it needs, picklable.

    ``build`` (a module-level function, so it pickles by name) makes the runtime's
    :class:`~app.engine.scheduler.PairScheduler` in the child from this spec (and its
    ``setup``, the builder's own options); ``preload`` is loaded before the runtime
    says it is ready (``serve --pair``, or the pair held when the last runtime died);
    ``remembered`` are explicit loads' options, kept across restarts;
    ``command_line_pairs`` the pairs made from ``--target``/``--draft`` (``serve``'s own,
    and those clients sent with a load), which the runtime adds to its catalog first.
    ``record_path``: where the runtime keeps its crash record (``<path>.activity``,
    ``<path>.fatal``); ``log_path``: the engine's log file, which the runtime follows
    when the front rotates it.
    """

    build: Callable[[RuntimeSpec], PairScheduler]
    defaults: LoadOptions
    keep_alive: float | None = None
    runtime: str | None = None
    setup: Any = None
    preload: tuple[str, LoadOptions] | None = None
    remembered: dict[str, LoadOptions] = field(default_factory=dict)
    command_line_pairs: tuple[Catalog, ...] = ()
    record_path: Path | None = None
    log_path: Path | None = None


# -- front -> runtime ----------------------------------------------------------------


@dataclass(frozen=True)
class SubmitJob:
    """A job for the runtime's queue: its runtime half only.

    ``generation`` builds the request against the loaded engine (a
    :class:`~app.engine.job_requests.ChatGeneration` or the like); ``inspect`` runs a
    function on it (counting a prompt's tokens); neither: a load job."""

    id: str
    pair: str
    kind: str
    generation: Callable[[Engine], Any] | None = None
    load_options: LoadOptions | None = None
    inspect: Callable[[Engine], Any] | None = None
    # A load's pair made from a client's --target/--draft files: the runtime adds it
    # (if it has no pair of that name) before it takes the job.
    command_line_pair: Catalog | None = None


@dataclass(frozen=True)
class CancelJob:
    """Stop a job: at once if it waits, else at the loop's next round."""

    id: str
    reason: str


@dataclass(frozen=True)
class AskSnapshot:
    """Ask for the scheduler's snapshot (what is loaded, for ``/health``)."""

    ask_id: int


@dataclass(frozen=True)
class StopRuntime:
    """Cancel everything, unload and exit."""

    reason: str


# -- runtime -> front ----------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeReady:
    """The runtime takes jobs (after its preload; ``preload_error`` when that failed)."""

    pid: int
    preload_error: str | None = None


@dataclass(frozen=True)
class JobTaken:
    """The runtime's worker took the job: it no longer waits in the queue."""

    id: str


@dataclass(frozen=True)
class JobEnd:
    """A job's last item (the queue's ``END``, which does not pickle as itself)."""


@dataclass(frozen=True)
class TokenBytes:
    """The bytes of tokens the next event's logprobs name, for a job that asked for
    logprobs: the front writes their text without the vocabulary."""

    table: dict[int, bytes]


@dataclass(frozen=True)
class JobItem:
    """One of a job's items: a notice, its :class:`PreparedGeneration`, an event,
    :class:`TokenBytes`, an error (an ``ApiError``), or :class:`JobEnd`."""

    id: str
    item: object


@dataclass(frozen=True)
class RuntimeState:
    """The runtime's queue and the pair it holds, sent whenever they may have changed."""

    queue: QueueState
    held: tuple[str, LoadOptions] | None
    loading: str | None
    remembered: dict[str, LoadOptions]
    loads: int


@dataclass(frozen=True)
class SnapshotAnswer:
    """The answer to :class:`AskSnapshot`."""

    ask_id: int
    snapshot: SchedulerSnapshot
