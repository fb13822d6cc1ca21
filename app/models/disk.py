"""Room on the disk and sizes for people: free bytes, the refusal that names the fix."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from app.errors import (
    DiskSpaceError,
)


def format_bytes(count: int) -> str:
    """A byte count for people, in decimal units like pip: ``1.1 GB``, ``491.4 MB``."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def disk_free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds ``path`` (or would, once created)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def ensure_free_space(
    directory: Path,
    required_bytes: int,
    purpose: str,
    free_bytes: Callable[[Path], int] = disk_free_bytes,
) -> None:
    """Raise :class:`DiskSpaceError` unless ``directory`` has ``required_bytes`` free."""
    free = free_bytes(directory)
    if free < required_bytes:
        raise DiskSpaceError(
            f"Not enough disk space in {directory} to {purpose}: it needs about "
            f"{format_bytes(required_bytes)} and {format_bytes(free)} is free. Free up space, "
            "or set DRAFTPEN_MODELS_DIR to a directory on a disk with more room."
        )


def tree_size(directory: Path) -> int:
    total = 0
    # os.walk skips directories that vanish while it walks (pip cleans up as it goes).
    for parent, _, filenames in os.walk(directory):
        for filename in filenames:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(parent, filename)).st_size
    return total
