"""Earlier sessions' token streams, kept per tokenizer, for the n-gram drafter.

Every reply an engine writes (with its prompt's new part) goes into a
:class:`~backends.speculation.history_index.HistoryIndex` the n-gram drafter looks up,
so a new session's repeated work (the same file written again, the same scaffold, the
same answer) is drafted for free. Adding a reply is handed to a background thread:
the request only puts it on a queue. The streams are saved per tokenizer to
``<key>.history`` in the history directory (written to a temporary name and renamed,
at most every :data:`SAVE_INTERVAL_SECONDS` and when the engine closes) and loaded by
any later engine whose target has the same tokenizer.

The files hold replies' and prompts' content, so the directory is 0700 and the files
0600. A file that does not read back whole, or whose header names another tokenizer
than its name, is logged, deleted and read around. The index is bounded in RAM (its
capacity in tokens) and the files on disk (a file holds at most the index's capacity,
and over the byte budget the least recently written other tokenizers' files go).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import queue
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from backends.base import Model
from backends.caches.disk_prefixes import wait_for_jobs
from backends.caches.history_file import (
    CorruptHistoryError,
    read_header,
    read_history,
    write_history,
)
from backends.generation_events import GenerationEvent
from backends.token_prefix import common_prefix_length

log = logging.getLogger(__name__)

SUFFIX = ".history"
SAVE_INTERVAL_SECONDS = 30.0
# A prompt's new part is kept up to this many of its last tokens: a first session's
# long system prompt would otherwise fill the index with the same instructions.
MAX_PROMPT_PART = 4096
# The prompt's last tokens are kept before every reply, new or not, so the reply's
# first tokens are found after the prompt's end (the same question asked again).
PROMPT_END_TOKENS = 32
# The tokenizer's fingerprint reads this many token ids spread over the vocabulary
# (every token would cost a second of a runtime's vocabulary calls).
FINGERPRINT_SAMPLES = 4096
# A temporary file older than this was left by a process that died while writing.
STALE_TEMP_SECONDS = 3600
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


class StreamIndex(Protocol):
    """What is kept in RAM: the index the n-gram drafter looks up
    (backends/speculation/history_index.py's ``HistoryIndex``)."""

    def add(self, stream: Sequence[int]) -> None:
        """Store one token stream."""
        ...

    def load(self, tokens: np.ndarray) -> None:
        """Store streams as :meth:`stored` returned them."""
        ...

    def stored(self) -> np.ndarray:
        """Every token held, oldest first, streams separated: what is saved."""
        ...

    def clear(self) -> None:
        """Forget every stream."""
        ...

    def __len__(self) -> int:
        """The tokens held."""
        ...


@dataclass(frozen=True)
class HistorySettings:
    """Where the history files live and the bytes the index may use (RAM, and disk
    for all tokenizers' files together)."""

    directory: Path
    budget_bytes: int


@dataclass(frozen=True)
class StoredHistory:
    """One tokenizer's history file, as ``draftpen cache`` lists it."""

    path: Path
    label: str
    tokens: int
    nbytes: int
    modified: float


@dataclass(frozen=True)
class HistoryStats:
    """What the history has done in this engine, for ``/health`` and the benchmarks."""

    loaded_tokens: int = 0
    added_streams: int = 0
    added_tokens: int = 0
    add_seconds: float = 0.0  # on the background thread, never the request's
    saved: int = 0
    save_failed: int = 0


def tokenizer_key(model: Model) -> str:
    """A short fingerprint of ``model``'s tokenizer: its facts and a spread of its
    tokens' bytes. Token ids mean the same text exactly when it matches."""
    info = model.vocab_info()
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr(info).encode())
    step = max(1, info.n_vocab // FINGERPRINT_SAMPLES)
    for token in [*range(0, info.n_vocab, step), info.n_vocab - 1]:
        piece = model.token_bytes(token)
        digest.update(len(piece).to_bytes(2, "little") + piece)
    return digest.hexdigest()


class DraftHistory:
    """One engine's history index: loaded from its tokenizer's file, grown by every
    reply on a background thread, and saved back."""

    def __init__(
        self,
        settings: HistorySettings,
        model: Model,
        index: StreamIndex,
        *,
        save_interval: float = SAVE_INTERVAL_SECONDS,
    ) -> None:
        """Start loading ``model``'s tokenizer's file into ``index`` (an empty index
        sized for ``settings.budget_bytes``) on the background thread."""
        self.settings = settings
        self.index = index
        self.save_interval = save_interval
        self.key = ""
        self.label = f"{getattr(model, 'name', '?')} tokenizer"
        self._known: list[int] = []  # the last prompt and reply added
        # Whether this tokenizer's file was there when last read or written: gone since,
        # it was cleared (`draftpen cache clear`), and what this engine holds goes too.
        self._file_seen = False
        self._dirty = False
        self._saved_at = time.monotonic()
        self._lock = threading.Lock()
        self._stats = HistoryStats()
        self._jobs: queue.Queue[tuple[str, object] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="draft-history", daemon=True)
        self._worker.start()
        self._jobs.put(("open", model))

    # -- on the request's path: queue only ------------------------------------------

    def add(self, prompt: Sequence[int], reply: Sequence[int]) -> None:
        """Remember a reply to ``prompt`` (queued: the background thread indexes it)."""
        if reply:
            self._jobs.put(("add", (list(prompt), list(reply))))

    def remembering(
        self, events: Iterator[GenerationEvent], prompt: Sequence[int]
    ) -> Iterator[GenerationEvent]:
        """``events``, and what they wrote added once the reply ends (or is stopped)."""
        reply: list[int] = []
        try:
            for event in events:
                reply.extend(event.tokens)
                yield event
        finally:
            self.add(prompt, reply)

    # -- after ------------------------------------------------------------------------

    def stats(self) -> HistoryStats:
        """A snapshot of the figures."""
        with self._lock:
            return self._stats

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job is done; False on timeout."""
        return wait_for_jobs(self._jobs, timeout, poll=0.005)

    def save(self) -> None:
        """Save now (queued; :meth:`flush` waits for it)."""
        self._jobs.put(("save", None))

    def close(self, timeout: float = 30.0) -> None:
        """Index what is queued, save, and stop the background thread."""
        if not self._worker.is_alive():
            return
        self.save()
        self._jobs.put(None)
        self._worker.join(timeout=timeout)

    # -- the background thread ------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                kind, payload = job
                if kind == "open":
                    self._open(payload)  # type: ignore[arg-type]
                elif kind == "add":
                    self._add(*payload)  # type: ignore[misc]
                elif kind == "save" and self._dirty:
                    self._save()
            except Exception:  # never let the thread die: drafting goes on without it
                log.exception("history index: a %s failed", job[0] if job else "stop")
            finally:
                self._jobs.task_done()

    def _open(self, model: Model) -> None:
        self.key = tokenizer_key(model)
        directory = self.settings.directory
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)  # the files hold replies' and prompts' content
        _tidy(directory)
        path = self._path()
        try:
            with path.open("rb") as raw:
                tokens = read_history(raw, path.stat().st_size, self.key)
        except FileNotFoundError:
            return
        except (OSError, ValueError, struct.error, CorruptHistoryError) as error:
            log.warning("history index: %s cannot be used (%s); deleted", path.name, error)
            path.unlink(missing_ok=True)
            return
        self.index.load(tokens)
        self._file_seen = True
        self._count(loaded_tokens=len(self.index))

    def _forget_if_cleared(self) -> None:
        """Forget what this engine holds when its file was deleted since it was last
        read or written: whoever cleared it meant these replies too."""
        if self._file_seen and self.key and not self._path().exists():
            log.info("history index: its file was deleted; the replies held in RAM go too")
            self.index.clear()
            self._known = []
            self._file_seen = False

    def _add(self, prompt: list[int], reply: list[int]) -> None:
        self._forget_if_cleared()
        started = time.perf_counter()
        shared = common_prefix_length(self._known, prompt)
        begin = max(0, min(shared, len(prompt) - PROMPT_END_TOKENS), len(prompt) - MAX_PROMPT_PART)
        stream = prompt[begin:] + reply
        self.index.add(stream)
        self._known = prompt + reply
        self._dirty = True
        self._count(
            added_streams=1, added_tokens=len(stream), add_seconds=time.perf_counter() - started
        )
        if time.monotonic() - self._saved_at >= self.save_interval:
            self._save()

    def _save(self) -> None:
        if not self.key:
            return
        self._forget_if_cleared()
        self._saved_at = time.monotonic()
        tokens = self.index.stored()
        directory = self.settings.directory
        temporary = directory / f"tmp-{uuid.uuid4().hex}"
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as raw:
                write_history(raw, self.key, self.label, tokens)
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(temporary, self._path())
        except OSError as error:
            temporary.unlink(missing_ok=True)
            full = error.errno in _DISK_FULL
            log.warning("history index: not saved (%s)", "the disk is full" if full else error)
            self._count(save_failed=1)
            return
        self._dirty = False
        self._file_seen = True
        self._count(saved=1)
        _keep_within(directory, self.settings.budget_bytes, keep=self._path())

    def _path(self) -> Path:
        return self.settings.directory / f"{self.key}{SUFFIX}"

    def _count(self, **changes: float) -> None:
        with self._lock:
            values = self._stats.__dict__ | {
                name: getattr(self._stats, name) + change for name, change in changes.items()
            }
            self._stats = HistoryStats(**values)


# -- the directory, for listing and clearing ------------------------------------------


def stored_histories(directory: Path) -> list[StoredHistory]:
    """Every tokenizer's history file that reads as one, most recently written first
    (a damaged one is deleted and left out)."""
    found: list[StoredHistory] = []
    if not directory.is_dir():
        return found
    for path in directory.glob(f"*{SUFFIX}"):
        try:
            with path.open("rb") as raw:
                header = read_header(raw)
            stat = path.stat()
        except FileNotFoundError:
            continue
        except (OSError, CorruptHistoryError) as error:
            log.warning("history index: %s cannot be used (%s); deleted", path.name, error)
            path.unlink(missing_ok=True)
            continue
        if header.get("key") != path.stem:
            log.warning("history index: %s is another tokenizer's file; deleted", path.name)
            path.unlink(missing_ok=True)
            continue
        label = str(header.get("label", "?"))
        tokens = int(header["tokens"])  # type: ignore[call-overload]
        found.append(StoredHistory(path, label, tokens, stat.st_size, stat.st_mtime))
    return sorted(found, key=lambda item: item.modified, reverse=True)


def clear_histories(directory: Path) -> tuple[int, int]:
    """Delete every history file (and stray temporary file); how many, and their bytes."""
    count = freed = 0
    if not directory.is_dir():
        return 0, 0
    for path in directory.iterdir():
        if path.suffix == SUFFIX or path.name.startswith("tmp-"):
            with contextlib.suppress(OSError):
                freed += path.stat().st_size
            path.unlink(missing_ok=True)
            count += path.suffix == SUFFIX
    return count, freed


def _keep_within(directory: Path, budget_bytes: int, *, keep: Path) -> None:
    """Delete other tokenizers' files, least recently written first, past the budget."""
    files = stored_histories(directory)
    used = sum(item.nbytes for item in files)
    for item in reversed(files):
        if used <= budget_bytes:
            return
        if item.path != keep:
            item.path.unlink(missing_ok=True)
            used -= item.nbytes


def _tidy(directory: Path) -> None:
    """Delete temporary files a dead process left."""
    now = time.time()
    for path in directory.glob("tmp-*"):
        try:
            stale = now - path.stat().st_mtime > STALE_TEMP_SECONDS
        except OSError:
            continue
        if stale:
            path.unlink(missing_ok=True)
