"""What ``draftpen serve``'s runtime process is made of: the catalog's pairs, the caches
``serve`` asked for, and llama.cpp watched (its aborts, its workers' connections).

``serve`` puts a :class:`CatalogRuntime` in the runtime's spec; the runtime process
calls :func:`build_catalog_runtime` (by name: it pickles as a reference) to make its
scheduler. Only that process loads a model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from app.engine.runtime_wire import RuntimeSpec
from app.engine.scheduler import PairScheduler
from app.engine.worker_options import (
    keep_worker_connections_alive,
    watch_for_hung_workers,
    watch_runtime_aborts,
)

if TYPE_CHECKING:
    from backends.caches.draft_history import HistorySettings


def runtime_record_path(socket_path: Path) -> Path:
    """Where the runtime process keeps its crash record: ``<socket>.runtime.activity``
    and ``<socket>.runtime.fatal`` (the front keeps ``<socket>.activity``, as before)."""
    return socket_path.with_name(f"{socket_path.name}.runtime")


@dataclasses.dataclass(frozen=True)
class CatalogRuntime:
    """What ``serve``'s runtime process needs to load catalog pairs (picklable)."""

    runtime: str | None
    conversation_cache_bytes: int
    prefix_cache_bytes: int
    history: HistorySettings | None
    worker_timeout: float


def build_catalog_runtime(spec: RuntimeSpec) -> PairScheduler:
    """In the runtime process: watch llama.cpp (its aborts, its workers' connections),
    and the scheduler that loads catalog pairs with the caches ``serve`` asked for."""
    from app.engine.cache_options import open_prefix_store
    from app.engine.pairs import catalog_loader

    setup: CatalogRuntime = spec.setup
    if setup.runtime == "llamacpp":
        watch_llamacpp(setup.worker_timeout)
    loader = catalog_loader(
        setup.runtime,
        conversation_cache_bytes=setup.conversation_cache_bytes,
        prefix_store=open_prefix_store(setup.prefix_cache_bytes),
        history=setup.history,
    )
    return PairScheduler(loader, spec.defaults, keep_alive=spec.keep_alive)


def watch_llamacpp(worker_timeout: float) -> None:
    """In the process that runs llama.cpp: name the workers an abort loses, keep their
    connections alive, and break a hung one's."""
    watch_runtime_aborts()
    keep_worker_connections_alive()
    watch_for_hung_workers(worker_timeout)
