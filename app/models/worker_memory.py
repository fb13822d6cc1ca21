"""The workers' memory, for the fit of pairs that only fit across machines.

``draftpen models list`` and the models screen ask each worker of the ``workers``
setting for its free memory (``backends.workers.wire``, a short timeout each), so a pair
too big for this machine alone shows as fitting "with 2 workers" when it does.
"""

from __future__ import annotations

import dataclasses

from app.models.fit import MachineMemory
from app.settings import Settings
from backends.errors import BackendError
from backends.workers.cluster import Workers
from backends.workers.endpoints import WorkerAddressError
from backends.workers.wire import probe

WORKER_ASK_TIMEOUT = 1.0  # the models screen asks on its thread: a LAN answers in ms


def with_workers(machine: MachineMemory, settings: Settings) -> tuple[MachineMemory, list[str]]:
    """``machine`` with the free memory of the workers that answer, and a line on each."""
    if not settings.workers.strip():
        return machine, []
    try:
        workers = Workers.parse(settings.workers)
    except WorkerAddressError as error:
        return machine, [f"workers setting: {error}"]
    free: list[int] = []
    lines = []
    for endpoint in workers.endpoints:
        try:
            info = probe(endpoint, timeout=WORKER_ASK_TIMEOUT)
        except BackendError as error:
            lines.append(f"worker {endpoint}: not counted ({error})")
            continue
        free.append(info.free_bytes)
        lines.append(f"worker {endpoint}: {info.free_bytes / (1 << 30):.1f} GiB free")
    return dataclasses.replace(machine, worker_free_bytes=tuple(free)), lines
