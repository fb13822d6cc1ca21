"""Which pair the engine holds in memory: loading on demand, keep-alive, reloads.

Like Ollama's scheduler: a request names a pair (its ``model``), and the pair is loaded
when it is not in memory; after ``keep_alive`` seconds without work it is unloaded
(None: never; 0: as soon as the queue is empty). One pair is held at a time: loading
another unloads the first, which is what the machines draftpen targets can afford
(a 2-core laptop holds one pair in RAM, a GPU one pair in VRAM).

Only the queue's worker thread calls :meth:`PairScheduler.acquire`, :meth:`touch` and
the unloads, so a model is never freed under a generation; other threads read
:meth:`snapshot` for ``/health`` and ``/v1/models``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from app.client.wire import ConversationCacheReport, LoadedPairReport
from backends.engine import Engine
from backends.workers.cluster import Workers

logger = logging.getLogger("draftpen.server")


@dataclass(frozen=True)
class LoadOptions:
    """How a pair is loaded: what needs a reload to change."""

    context_length: int
    exact: bool
    # Sequences generating at once (``serve --parallel``); None: as many as memory
    # allows, up to four (app/models/fit.py).
    parallel: int | None = 1
    # Other machines holding part of the target's layers (serve --workers); None: none.
    workers: Workers | None = None


class PairLoader(Protocol):
    """Loads a pair by name, reporting progress in lines of text."""

    def __call__(self, name: str, options: LoadOptions, report: Callable[[str], None]) -> Engine:
        """The loaded engine; raises an error whose message names the fix."""
        ...


@dataclass
class LoadedPair:
    """A pair in memory and how it was loaded."""

    name: str
    engine: Engine
    options: LoadOptions
    loaded_at: float
    last_used: float


@dataclass(frozen=True)
class SchedulerSnapshot:
    """What is loaded and what is loading, at one moment."""

    loaded: tuple[LoadedPairReport, ...]
    loading: str | None


class PairScheduler:
    """The one pair in memory, loaded by name when a job needs it."""

    def __init__(
        self,
        loader: PairLoader,
        defaults: LoadOptions,
        *,
        keep_alive: float | None = None,
    ) -> None:
        self.loader = loader
        self.defaults = defaults
        self.keep_alive = keep_alive
        self.loads = 0  # how many times a pair was loaded, for tests and the log
        self._lock = threading.Lock()
        self._loaded: LoadedPair | None = None
        self._loading: str | None = None
        # Settings of an explicit load, reused when the pair is loaded again on demand.
        self._remembered: dict[str, LoadOptions] = {}

    def adopt(self, name: str, engine: Engine, options: LoadOptions) -> None:
        """Hold an engine loaded elsewhere (``serve --pair`` loads before listening)."""
        now = time.monotonic()
        with self._lock:
            self._loaded = LoadedPair(name, engine, options, now, now)
            self._remembered[name] = options

    def loaded_name(self) -> str | None:
        """The name of the pair in memory, if any."""
        with self._lock:
            return self._loaded.name if self._loaded else None

    def acquire(
        self, name: str, options: LoadOptions | None, report: Callable[[str], None]
    ) -> tuple[LoadedPair, bool]:
        """The pair ``name`` in memory, loading it if needed (worker thread only).

        ``options`` given (an explicit load) reload the pair if it is held with other
        ones; None takes it as it is held, or loads it with the options of its last
        explicit load, else the defaults. Returns the pair and whether it was loaded now.
        """
        with self._lock:
            current = self._loaded
        if (
            current is not None
            and current.name == name
            and (options is None or options == current.options)
        ):
            return current, False
        if current is not None:
            self._unload(current, f"to load {name}" if current.name != name else "to reload it")
        wanted = options or self._remembered.get(name, self.defaults)
        with self._lock:
            self._loading = name
        started = time.monotonic()
        try:
            report(f"loading {name} ({wanted.context_length}-token context)")
            engine = self.loader(name, wanted, report)
        finally:
            with self._lock:
                self._loading = None
        now = time.monotonic()
        loaded = LoadedPair(name, engine, wanted, now, now)
        with self._lock:
            self._loaded = loaded
            if options is not None:
                self._remembered[name] = options
            self.loads += 1
        logger.info("loaded %s in %.1fs", name, now - started)
        return loaded, True

    def held(self) -> tuple[str, LoadOptions] | None:
        """The pair in memory and how it was loaded, if any."""
        with self._lock:
            current = self._loaded
        return (current.name, current.options) if current is not None else None

    def loading_name(self) -> str | None:
        """The pair being loaded now, if any."""
        with self._lock:
            return self._loading

    def remembered(self) -> dict[str, LoadOptions]:
        """The options of each pair's last explicit load."""
        with self._lock:
            return dict(self._remembered)

    def remember(self, options: dict[str, LoadOptions]) -> None:
        """Take over explicit loads' options (a runtime started again keeps them)."""
        with self._lock:
            self._remembered.update(options)

    def options_for(self, name: str) -> LoadOptions:
        """How ``name`` is held now, or would be loaded on demand."""
        with self._lock:
            if self._loaded is not None and self._loaded.name == name:
                return self._loaded.options
            return self._remembered.get(name, self.defaults)

    def touch(self) -> None:
        """A job just finished with the loaded pair: its keep-alive starts again."""
        with self._lock:
            if self._loaded is not None:
                self._loaded.last_used = time.monotonic()

    def unload_deadline(self) -> float | None:
        """When keep-alive unloads the idle pair (monotonic time); None: never or nothing."""
        with self._lock:
            if self._loaded is None or self.keep_alive is None:
                return None
            return self._loaded.last_used + self.keep_alive

    def unload(self, reason: str) -> None:
        """Free the pair in memory, if any (worker thread, or after it stopped)."""
        with self._lock:
            current = self._loaded
        if current is not None:
            self._unload(current, reason)

    def _unload(self, loaded: LoadedPair, reason: str) -> None:
        with self._lock:
            if self._loaded is loaded:
                self._loaded = None
        loaded.engine.close()
        logger.info("unloaded %s (%s)", loaded.name, reason)

    def report(self, loaded: LoadedPair) -> LoadedPairReport:
        """What ``/health`` says of a loaded pair, keep-alive included."""
        idle = time.monotonic() - loaded.last_used
        unloads_in = None
        if self.keep_alive is not None:
            unloads_in = round(max(0.0, self.keep_alive - idle), 3)
        engine = loaded.engine
        conversations = engine.conversations
        return LoadedPairReport(
            pair=loaded.name,
            target=engine.target.name,
            draft=engine.draft.name if engine.draft is not None else None,
            heads=engine.head_names(),
            context_length=engine.target.n_ctx,
            exact=loaded.options.exact,
            idle_seconds=round(idle, 3),
            unloads_in=unloads_in,
            target_placement=getattr(engine.target, "placement", None),
            draft_placement=getattr(engine.draft, "placement", None),
            overlap_drafting=engine.overlaps(),
            conversation_cache=(
                ConversationCacheReport(**conversations.stats().as_dict())
                if conversations is not None
                else None
            ),
        )

    def snapshot(self) -> SchedulerSnapshot:
        """What is loaded (with its keep-alive) and what is loading."""
        with self._lock:
            current = self._loaded
            loading = self._loading
        loaded = (self.report(current),) if current is not None else ()
        return SchedulerSnapshot(loaded, loading)
