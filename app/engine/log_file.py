"""The engine's output in a log file that does not grow forever (``serve --log-file``).

Everything the engine writes, Python's logging and llama.cpp's own lines from C alike,
goes through file descriptors 1 and 2; so the log is opened and put under both
(``dup2``), and a thread looks at its size now and then: past the limit the file is
rotated (``app.client.engine_log``) and a fresh one put under both descriptors. Writes
in flight during the switch land in the rotated file, which is where they belong.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from app.client.engine_log import LOG_BACKUPS, LOG_MAX_BYTES, rotate_log

logger = logging.getLogger("draftpen.server")

# How often the engine looks at its log's size: a few MB take far longer to write.
LOG_CHECK_SECONDS = 30.0
STDOUT_STDERR = (1, 2)


class RotatingOutput:
    """File descriptors ``fds`` (stdout and stderr) writing to ``path``, rotated past
    ``max_bytes`` with ``backups`` older files kept."""

    def __init__(
        self,
        path: Path,
        *,
        fds: Sequence[int] = STDOUT_STDERR,
        max_bytes: int = LOG_MAX_BYTES,
        backups: int = LOG_BACKUPS,
        check_seconds: float = LOG_CHECK_SECONDS,
    ) -> None:
        self.path = path
        self.fds = tuple(fds)
        self.max_bytes = max_bytes
        self.backups = backups
        self.check_seconds = check_seconds
        self.rotations = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def open(self) -> None:
        """Rotate the log if it is already large, then point the descriptors at it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if rotate_log(self.path, self.max_bytes, self.backups):
                self.rotations += 1
            self._point_at_log()

    def check(self) -> bool:
        """Rotate the log if it has grown past the limit; returns whether it did."""
        with self._lock:
            if not rotate_log(self.path, self.max_bytes, self.backups):
                return False
            self.rotations += 1
            self._point_at_log()
        logger.info("rotated the log: the earlier part is in %s.1", self.path.name)
        return True

    def start_watching(self) -> None:
        """Check the size every ``check_seconds`` in a daemon thread until :meth:`stop`."""
        threading.Thread(target=self._watch, name="draftpen-log-rotation", daemon=True).start()

    def stop(self) -> None:
        """Stop watching (the descriptors stay on the log)."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.check_seconds):
            try:
                self.check()
            except OSError as error:  # a full disk or a removed directory: keep serving
                logger.warning("could not rotate %s: %s", self.path, error)

    def _point_at_log(self) -> None:
        for stream in (_python_stream(fd) for fd in self.fds):
            if stream is not None:
                stream.flush()  # what Python buffered belongs to the file it was written for
        log = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for fd in self.fds:
                os.dup2(log, fd)
        finally:
            os.close(log)


def _python_stream(fd: int) -> TextIO | None:
    """Python's stdout or stderr when it writes to ``fd``."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.fileno() == fd:
                return stream
        except (OSError, ValueError):
            continue
    return None


def follow_log(path: Path, check_seconds: float = LOG_CHECK_SECONDS) -> None:
    """Keep this process's stdout and stderr on ``path`` when another process (the
    engine's front, which rotates it) moves it away: the runtime process inherits the
    front's descriptors, and without this would write on in the rotated file."""

    def follow() -> None:
        while True:
            try:
                current = os.stat(path)
                written = os.fstat(STDOUT_STDERR[1])
                if (current.st_dev, current.st_ino) != (written.st_dev, written.st_ino):
                    log = os.open(path, os.O_WRONLY | os.O_APPEND)
                    try:
                        for fd in STDOUT_STDERR:
                            os.dup2(log, fd)
                    finally:
                        os.close(log)
            except OSError:
                pass  # no file yet (the front is rotating it): look again later
            time.sleep(check_seconds)

    threading.Thread(target=follow, name="draftpen-log-follow", daemon=True).start()
