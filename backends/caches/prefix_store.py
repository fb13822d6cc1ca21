"""Saved prompt prefixes on disk: the directory of files, their index, a byte budget.

Each saved state is one file, ``<id>.prefix``, laid out and checked as
backends/caches/prefix_file.py says. A file is written to a temporary name and renamed
into place, so a reader sees a whole file or none. A file that does not read back whole
(truncated, corrupt, saved for another model) is logged, deleted and never loaded.

``index.sqlite3`` says which block names (``prefix_keys.block_names``) each file
covers, its size and when it was last used; SQLite's locking lets two engines in one
home share the directory. The files hold prompts' content, so the directory is 0700
and the files 0600. Over the budget, the least recently used go first.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import struct
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from backends.caches.prefix_file import CorruptPrefixError, Decoded, read_prefix, write_prefix
from backends.caches.prefix_keys import block_end

log = logging.getLogger(__name__)

SUFFIX = ".prefix"
INDEX_NAME = "index.sqlite3"
# A temporary file older than this was left by a process that died while writing.
STALE_TEMP_SECONDS = 3600
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id TEXT PRIMARY KEY, key TEXT NOT NULL, label TEXT NOT NULL, tokens INTEGER NOT NULL,
    nbytes INTEGER NOT NULL, cuttable INTEGER NOT NULL, last_block TEXT NOT NULL,
    created REAL NOT NULL, last_used REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS blocks (
    name TEXT NOT NULL, tokens INTEGER NOT NULL, entry TEXT NOT NULL,
    PRIMARY KEY (name, entry)
);
CREATE INDEX IF NOT EXISTS blocks_by_entry ON blocks (entry);
"""


@dataclass(frozen=True)
class PrefixHit:
    """A saved state that covers a prompt's first ``tokens`` tokens (whole blocks); it
    holds ``entry_tokens`` in all, which may go on sharing more of the prompt."""

    entry: str
    tokens: int
    entry_tokens: int


@dataclass(frozen=True)
class StoredPrefix:
    """One saved state, as ``draftpen cache`` lists it."""

    entry: str
    label: str
    tokens: int
    nbytes: int
    created: float
    last_used: float


class PrefixStore:
    """A directory of saved states under a byte budget (thread-safe, shared by processes)."""

    def __init__(self, directory: str | Path, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("the prefix cache budget must be 0 bytes or more")
        self.directory = Path(directory)
        self.budget_bytes = budget_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # the files hold prompts' content
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.directory / INDEX_NAME, timeout=30, check_same_thread=False)
        os.chmod(self.directory / INDEX_NAME, 0o600)
        with self._lock, self._db:
            self._db.executescript(_SCHEMA)
        self._tidy()

    # -- finding and reading -------------------------------------------------

    def find(self, key: str, names: Sequence[str]) -> PrefixHit | None:
        """The saved state covering the most of the blocks ``names`` (a prompt's, in
        order), or None. ``key`` is only a check: block names already include it."""
        if not names:
            return None
        wanted = list(names)
        with self._lock:
            rows = self._db.execute(
                f"SELECT blocks.entry, blocks.tokens, entries.tokens FROM blocks JOIN entries "
                f"ON entries.id = blocks.entry WHERE entries.key = ? AND blocks.name IN "
                f"({','.join('?' * len(wanted))}) "
                f"ORDER BY blocks.tokens DESC, entries.tokens DESC LIMIT 1",
                [key, *wanted],
            ).fetchall()
        if not rows:
            return None
        entry, tokens, entry_tokens = rows[0]
        # Only a hit on the chain itself counts: block i's name at block i's end.
        index = tokens // (block_end(0)) - 1
        if index >= len(wanted) or block_end(index) != tokens:
            return None
        return PrefixHit(str(entry), int(tokens), int(entry_tokens))

    def read(
        self,
        hit: PrefixHit,
        key: str,
        decode: Callable[[tuple[int, ...], BinaryIO, int], Decoded],
    ) -> tuple[tuple[int, ...], Decoded] | None:
        """Read a saved state: its tokens and what ``decode(tokens, file, nbytes)`` made
        of its bytes. None (logged, the file deleted) when it does not read back whole."""
        path = self._path(hit.entry)
        try:
            with path.open("rb") as raw:
                tokens, decoded = read_prefix(raw, path.stat().st_size, key, decode)
        except FileNotFoundError:
            log.warning("prefix cache: %s is gone; the prompt is read instead", path.name)
            self._forget(hit.entry)
            return None
        except (OSError, ValueError, KeyError, struct.error, CorruptPrefixError) as error:
            log.warning(
                "prefix cache: %s cannot be used (%s); deleted, the prompt is read instead",
                path.name,
                error,
            )
            self.discard(hit.entry)
            return None
        with self._lock, self._db:
            self._db.execute(
                "UPDATE entries SET last_used = ? WHERE id = ?", (time.time(), hit.entry)
            )
        return tokens, decoded

    # -- writing ---------------------------------------------------------------

    def write(
        self,
        key: str,
        label: str,
        tokens: Sequence[int],
        names: Sequence[str],
        *,
        cuttable: bool,
        nbytes: int,
        encode: Callable[[BinaryIO], None],
    ) -> bool:
        """Save one state: ``encode(file)`` writes it (about ``nbytes``, for the budget
        before it is written). Index it under
        ``names`` (its whole blocks; only the last one unless ``cuttable``). False, with
        one log line, when it is not saved (over the budget, the disk full)."""
        if not names:
            return False
        if nbytes > self.budget_bytes:
            log.info(
                "prefix cache: a %d-token state (%.1f MB) is larger than the whole budget "
                "(%.1f MB); not saved",
                len(tokens),
                nbytes / 1e6,
                self.budget_bytes / 1e6,
            )
            return False
        self._make_room(nbytes)
        entry = uuid.uuid4().hex
        temporary = self.directory / f"tmp-{entry}"
        try:
            written = self._write_file(temporary, key, label, tokens, encode)
            os.replace(temporary, self._path(entry))
        except OSError as error:
            _remove(temporary)
            if error.errno in _DISK_FULL:
                log.warning(
                    "prefix cache: the disk is full, so a %d-token prompt state was not "
                    "saved (nothing else is lost; free some space or lower prefix_cache)",
                    len(tokens),
                )
            else:
                log.warning("prefix cache: could not save a prompt state (%s)", error)
            return False
        indexed = [
            (name, block_end(index), entry)
            for index, name in enumerate(names)
            if cuttable or index == len(names) - 1
        ]
        now = time.time()
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (entry, key, label, len(tokens), written, int(cuttable), names[-1], now, now),
            )
            self._db.executemany("INSERT OR IGNORE INTO blocks VALUES (?, ?, ?)", indexed)
        if cuttable:
            self._drop_covered(key, entry, names)
        return True

    # -- listing and clearing ------------------------------------------------------

    def entries(self) -> list[StoredPrefix]:
        """Every saved state, most recently used first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, label, tokens, nbytes, created, last_used FROM entries "
                "ORDER BY last_used DESC"
            ).fetchall()
        return [StoredPrefix(*row) for row in rows]

    def used_bytes(self) -> int:
        """The bytes the saved states take."""
        with self._lock:
            (total,) = self._db.execute("SELECT COALESCE(SUM(nbytes), 0) FROM entries").fetchone()
        return int(total)

    def discard(self, entry: str) -> None:
        """Delete one saved state and its index rows."""
        self._forget(entry)
        _remove(self._path(entry))

    def clear(self) -> int:
        """Delete every saved state; the number deleted."""
        stored = self.entries()
        for item in stored:
            self.discard(item.entry)
        return len(stored)

    def close(self) -> None:
        """Close the index (the files stay)."""
        with self._lock:
            self._db.close()

    # -- the parts -------------------------------------------------------------

    def _path(self, entry: str) -> Path:
        return self.directory / f"{entry}{SUFFIX}"

    def _write_file(
        self,
        path: Path,
        key: str,
        label: str,
        tokens: Sequence[int],
        encode: Callable[[BinaryIO], None],
    ) -> int:
        """Write one file; the bytes it takes."""
        with _open_new(path) as raw:
            write_prefix(raw, key, label, tokens, encode)
            raw.flush()
            os.fsync(raw.fileno())
            return raw.tell()

    def _make_room(self, nbytes: int) -> None:
        """Delete the least recently used states until ``nbytes`` more fit the budget."""
        while True:
            used = self.used_bytes()
            with self._lock:
                oldest = self._db.execute(
                    "SELECT id FROM entries ORDER BY last_used ASC LIMIT 1"
                ).fetchone()
            if used + nbytes <= self.budget_bytes or oldest is None:
                return
            self.discard(oldest[0])

    def _drop_covered(self, key: str, entry: str, names: Sequence[str]) -> None:
        """Delete cuttable states of ``key`` whose whole prefix the new ``entry`` holds."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, last_block FROM entries WHERE key = ? AND cuttable = 1 AND id != ?",
                (key, entry),
            ).fetchall()
        covered = set(names)
        for other, last_block in rows:
            if last_block in covered:
                self.discard(other)

    def _forget(self, entry: str) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM blocks WHERE entry = ?", (entry,))
            self._db.execute("DELETE FROM entries WHERE id = ?", (entry,))

    def _tidy(self) -> None:
        """Forget index rows without a file; delete files without a row, and temporary
        files a dead process left."""
        with self._lock:
            known = {row[0] for row in self._db.execute("SELECT id FROM entries")}
        present = set()
        now = time.time()
        for path in self.directory.iterdir():
            if path.suffix == SUFFIX:
                present.add(path.stem)
            # Not yet indexed may mean another engine is between its rename and its
            # index rows: only old strays are deleted.
            stray = path.name.startswith("tmp-") or (
                path.suffix == SUFFIX and path.stem not in known
            )
            if stray and _age(path, now) > STALE_TEMP_SECONDS:
                _remove(path)
        for entry in known - present:
            self._forget(entry)


def _open_new(path: Path) -> BinaryIO:
    """A new file only its owner can read (it will hold a prompt's content)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    return os.fdopen(descriptor, "wb")


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
