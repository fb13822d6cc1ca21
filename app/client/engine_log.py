"""The log of an engine a front end started: ``engine.log`` in the cache directory.

A front end starts ``draftpen serve --idle-exit --log-file PATH`` with its output going
to the log; an engine that runs for weeks beside an open chat app, or is started again
every day, would let it grow forever. So the log is rotated (``engine.log`` becomes
``engine.log.1``, the older one is dropped) whenever it has grown past
:data:`LOG_MAX_BYTES`: by the front end before it starts an engine, and by the engine
itself while it runs (``app.engine.log_file``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from app.settings import cache_dir

ENGINE_LOG_NAME = "engine.log"
# A few MB holds thousands of requests' lines and every load's messages.
LOG_MAX_BYTES = 4 << 20
# engine.log.1 only: the log of the run before the current one, or its older half.
LOG_BACKUPS = 1


def engine_log_path() -> Path:
    """Where an engine started by a client writes its log."""
    return cache_dir() / ENGINE_LOG_NAME


def backup_path(path: Path, number: int) -> Path:
    """``engine.log`` -> ``engine.log.1`` (``number`` 1), ``engine.log.2`` ..."""
    return path.with_name(f"{path.name}.{number}")


def rotate_log(path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> bool:
    """Move ``path`` to ``path.1`` (shifting older backups, dropping the oldest) when it
    has grown past ``max_bytes``; returns whether it did. A missing log is left alone.
    """
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    if backups < 1:
        path.unlink(missing_ok=True)
        return True
    for number in range(backups - 1, 0, -1):
        older = backup_path(path, number)
        with contextlib.suppress(FileNotFoundError):
            os.replace(older, backup_path(path, number + 1))
    os.replace(path, backup_path(path, 1))
    return True
