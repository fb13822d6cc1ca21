"""What ``draftpen serve``'s runtime process is made of: the catalog's pairs, the caches
``serve`` asked for, and llama.cpp watched (its aborts, its workers' connections).

``serve`` puts a :class:`CatalogRuntime` in the runtime's spec; the runtime process
calls :func:`build_catalog_runtime` (by name: it pickles as a reference) to make its
scheduler. Only that process loads a model.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from pathlib import Path

from app.engine.runtime_wire import RuntimeSpec
from app.engine.scheduler import PairScheduler
from app.engine.worker_options import (
    keep_worker_connections_alive,
    watch_for_hung_workers,
    watch_runtime_aborts,
)
from app.errors import DraftpenError
from app.settings import Settings
from backends.caches.prefix_store import PrefixStore

log = logging.getLogger(__name__)


def runtime_record_path(socket_path: Path) -> Path:
    """Where the runtime process keeps its crash record: ``<socket>.runtime.activity``
    and ``<socket>.runtime.fatal`` (the front keeps ``<socket>.activity``, as before)."""
    return socket_path.with_name(f"{socket_path.name}.runtime")


@dataclasses.dataclass(frozen=True)
class CatalogRuntime:
    """What ``serve``'s runtime process needs to load catalog pairs (picklable)."""

    runtime: str | None
    conversation_cache_bytes: int
    prefix_cache: str | None
    settings: Settings
    worker_timeout: float


def build_catalog_runtime(spec: RuntimeSpec) -> PairScheduler:
    """In the runtime process: watch llama.cpp (its aborts, its workers' connections),
    and the scheduler that loads catalog pairs with the caches ``serve`` asked for."""
    from app.engine.pairs import catalog_loader

    setup: CatalogRuntime = spec.setup
    if setup.runtime == "llamacpp":
        watch_llamacpp(setup.worker_timeout)
    loader = catalog_loader(
        setup.runtime,
        conversation_cache_bytes=setup.conversation_cache_bytes,
        prefix_store=prefix_store_for(setup.prefix_cache, setup.settings),
    )
    return PairScheduler(loader, spec.defaults, keep_alive=spec.keep_alive)


def watch_llamacpp(worker_timeout: float) -> None:
    """In the process that runs llama.cpp: name the workers an abort loses, keep their
    connections alive, and break a hung one's."""
    watch_runtime_aborts()
    keep_worker_connections_alive()
    watch_for_hung_workers(worker_timeout)


def prefix_cache_budget(option: str | None, settings: Settings) -> int:
    """The bytes ``--prefix-cache`` (else the setting) allows; a bad size is an error
    that names the option (``serve`` checks it before it starts the runtime)."""
    from app.settings import BYTE_SIZE_HINT, prefix_cache_bytes

    try:
        return prefix_cache_bytes(option if option is not None else settings.prefix_cache)
    except DraftpenError:
        raise DraftpenError(f"--prefix-cache wants {BYTE_SIZE_HINT}, not {option!r}.") from None


def prefix_store_for(option: str | None, settings: Settings) -> PrefixStore | None:
    """The disk cache of prompt prefixes ``--prefix-cache`` (else the setting) asks
    for; None when it is off or its directory cannot be made (logged: the engine runs
    without it)."""
    from app.settings import prefix_cache_dir

    budget = prefix_cache_budget(option, settings)
    if budget == 0:
        return None
    directory = prefix_cache_dir()
    try:
        return PrefixStore(directory, budget)
    except (OSError, sqlite3.Error) as error:
        log.warning("prefix cache off: %s cannot be used (%s)", directory, error)
        return None
