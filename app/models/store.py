"""The model store: verified model files (and converted mlx directories) on disk.

The store holds gguf models as flat files: ``<key>.gguf`` is a complete file whose size
and sha256 matched the catalog, and ``<key>.gguf.verified.json`` records that check
(sha256, size, mtime) so it is not repeated on every start. A download is written to
``<key>.gguf.part`` in the same directory and moved into place with ``os.replace`` only
after its checksum matched, so a file under the final name is never unverified, and a
file whose checksum fails is deleted, never returned.

mlx models converted locally from a gguf model live in ``<store>/mlx/<key>/``. Such a
directory is complete only when its marker file ``.draftpen-converted.json`` exists; the
marker is written last (:meth:`ModelStore.mark_converted`), after every file of the
conversion, and lists those files with their sizes, so a conversion that was killed
half-way is never loaded.

Models fetched from the Hugging Face hub live in the standard HF cache instead (shared
with other tools); :class:`~app.models.hub_copies.HubCopies` records which of them are complete
and verified, and the store answers for both places: a model resolves to whichever
complete, verified copy exists, the store's first. A source (see
:mod:`app.models.sources`) makes one model available and returns its verified path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal, NoReturn

from app.errors import (
    ChecksumMismatchError,
    DownloadError,
)
from app.models.catalog import (
    ModelEntry,
    shard_names,
)
from app.models.disk import tree_size
from app.models.hub import HubSettings
from app.models.hub_cache import HubCache
from app.models.hub_copies import HubCopies
from app.models.mlx_directory import is_complete

ModelState = Literal["downloaded", "partial", "absent"]
# verify: hashing a file already in the store; download: fetching from a source;
# assemble: writing (and hashing) the .part file; discard: a stored file failed its
# checksum and was deleted; convert: making an mlx model from a gguf model; done: the
# model is verified and in place.
ProgressStage = Literal["verify", "download", "assemble", "discard", "convert", "done"]
ProgressCallback = Callable[[str, ProgressStage, int, int], None]
"""Called as ``progress(model_key, stage, done_bytes, total_bytes)``."""

HASH_CHUNK_BYTES = 8 * 1024 * 1024
PARTIAL_SUFFIX = ".part"
SIDECAR_SUFFIX = ".verified.json"
CONVERTED_MARKER = ".draftpen-converted.json"
"""The file, written last, that marks a converted mlx directory as complete."""
MLX_STORE_DIR = "mlx"


def no_progress(model_key: str, stage: ProgressStage, done_bytes: int, total_bytes: int) -> None:
    """A progress callback that ignores everything."""


def scratch_prefix(entry: ModelEntry) -> str:
    """Name prefix of a source's temporary directory for ``entry`` inside the store."""
    return f".{entry.filename}.download-"


def sha256_of_file(
    path: Path, model_key: str = "", progress: ProgressCallback = no_progress
) -> str:
    """The sha256 of a file, read in chunks so a large model never sits in memory."""
    hasher = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as file:
        while chunk := file.read(HASH_CHUNK_BYTES):
            hasher.update(chunk)
            done += len(chunk)
            progress(model_key, "verify", done, total)
    return hasher.hexdigest()


class ModelStore:
    """draftpen's own model directory: ``<key>.gguf`` files and ``mlx/<key>/`` directories."""

    def __init__(self, root: Path, hub_cache: HubCache | None = None) -> None:
        self.root = root
        self.hub_cache = hub_cache or HubCache(HubSettings.from_env().cache_dir)
        self.hub = HubCopies(root, self.hub_cache)

    def path_for(self, entry: ModelEntry) -> Path:
        """Where the verified file (gguf) or directory (mlx) for ``entry`` lives, if it does."""
        if entry.format == "mlx":
            return self.converted_dir_for(entry)
        return self.root / entry.filename

    def converted_dir_for(self, entry: ModelEntry) -> Path:
        """The directory a gguf_conversion of the mlx model ``entry`` must be written to.

        The converter writes config.json, the safetensors and the tokenizer files there;
        the directory counts as complete only after :meth:`mark_converted`.
        """
        if entry.format != "mlx":
            raise ValueError(f"{entry.key} is a {entry.format} model, not an mlx model")
        return self.root / MLX_STORE_DIR / entry.key

    def mark_converted(self, entry: ModelEntry, from_model: str | None = None) -> None:
        """Record that ``entry``'s converted directory is complete; call it last.

        The marker lists every file with its size, so a later change (a file deleted or
        truncated) makes the directory incomplete again.
        """
        directory = self.converted_dir_for(entry)
        files = {
            path.relative_to(directory).as_posix(): path.stat().st_size
            for path in sorted(directory.rglob("*"))
            if path.is_file() and path.name != CONVERTED_MARKER
        }
        if "config.json" not in files:
            raise DownloadError(
                f"The conversion of {entry.key} wrote no config.json into {directory}; "
                "it is not an MLX model. Report this as a draftpen bug."
            )
        record = {"model": entry.key, "from": from_model, "files": files}
        staging = directory / (CONVERTED_MARKER + PARTIAL_SUFFIX)
        staging.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        os.replace(staging, directory / CONVERTED_MARKER)

    def is_converted(self, entry: ModelEntry) -> bool:
        """Whether ``entry``'s converted directory is complete: marker there, files intact."""
        directory = self.converted_dir_for(entry)
        try:
            record = json.loads((directory / CONVERTED_MARKER).read_text(encoding="utf-8"))
            files = record["files"]
            return bool(files) and all(
                (directory / name).stat().st_size == size for name, size in files.items()
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False

    def partial_path_for(self, entry: ModelEntry) -> Path:
        """Where a download of ``entry`` is written before it is verified."""
        return self.root / (entry.filename + PARTIAL_SUFFIX)

    def sidecar_path_for(self, entry: ModelEntry) -> Path:
        """The record of the last successful checksum of ``entry``'s file."""
        return self.root / (entry.filename + SIDECAR_SUFFIX)

    def state(self, entry: ModelEntry) -> ModelState:
        """``downloaded`` (verified), ``partial`` (a download or unchecked file), ``absent``.

        Counts the store's copy and the HF cache's. Cheap: it reads sidecars, markers and
        records, and never hashes a file. A user's own file is ``downloaded`` while it is
        there.
        """
        if entry.is_local:
            return "downloaded" if user_file(entry) is not None else "absent"
        local = self._local_state(entry)
        if local == "downloaded" or self.hub.path(entry) is not None:
            return "downloaded"
        return "partial" if local == "partial" or self.hub.is_partial(entry) else "absent"

    def _local_state(self, entry: ModelEntry) -> ModelState:
        if entry.format == "mlx":
            if self.is_converted(entry):
                return "downloaded"
            return "partial" if self.converted_dir_for(entry).exists() else "absent"
        path = self.path_for(entry)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return "partial" if self.partial_path_for(entry).exists() else "absent"
        return "downloaded" if self._sidecar_matches(entry, stat) else "partial"

    def path_if_verified(
        self, entry: ModelEntry, progress: ProgressCallback = no_progress
    ) -> Path | None:
        """The verified file (or directory) for ``entry``, in the store or the HF cache.

        ``None`` if neither holds a complete copy. A gguf file another tool put in the HF
        cache is hashed once and recorded (see :meth:`HubCopies.adopt`). A user's own file
        is used where it lies, as it is (draftpen has no checksum of it).
        """
        if entry.is_local:
            return user_file(entry)
        local = self._local_path_if_verified(entry, progress)
        if local is not None:
            return local
        return self.hub.path(entry) or (self.hub.adopt(entry) if entry.format == "gguf" else None)

    def _local_path_if_verified(
        self, entry: ModelEntry, progress: ProgressCallback = no_progress
    ) -> Path | None:
        """The file for ``entry`` if it is there and verified; ``None`` if it is not there.

        When the sidecar is missing or stale (the file was replaced or touched), the file
        is hashed again. A file that fails is deleted and :class:`ChecksumMismatchError`
        raised, so a damaged file is never returned. For an mlx model: its converted
        directory when complete.
        """
        if entry.format == "mlx":
            return self.converted_dir_for(entry) if self.is_converted(entry) else None
        path = self.path_for(entry)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        if self._sidecar_matches(entry, stat):
            return path
        return self._verify_now(entry, stat, progress)

    def verify(self, entry: ModelEntry, progress: ProgressCallback = no_progress) -> Path | None:
        """Re-check ``entry``'s copy now (the store's, else the HF cache's); ``None`` if absent.

        Raises :class:`ChecksumMismatchError` (and deletes what failed). A user's own file
        is only looked for: it has no checksum to check.
        """
        if entry.is_local:
            return user_file(entry)
        local = self._verify_local(entry, progress)
        return local if local is not None else self.hub.verify(entry)

    def _verify_local(
        self, entry: ModelEntry, progress: ProgressCallback = no_progress
    ) -> Path | None:
        """Hash ``entry``'s file now, whatever the sidecar says; ``None`` if it is absent.

        Raises :class:`ChecksumMismatchError` (and deletes the file) when it fails. An mlx
        directory is checked against its marker's file list (it has no catalog sha256).
        """
        if entry.format == "mlx":
            return self._verify_converted(entry)
        try:
            stat = self.path_for(entry).stat()
        except FileNotFoundError:
            return None
        return self._verify_now(entry, stat, progress)

    def install(self, entry: ModelEntry, partial: Path, sha256: str) -> Path:
        """Move a finished download into place if its size and ``sha256`` match the catalog.

        ``sha256`` is what the source computed while writing ``partial``. On a mismatch
        the partial file is deleted and :class:`ChecksumMismatchError` raised.
        """
        stat = partial.stat()
        if entry.sha256 is None:
            partial.unlink(missing_ok=True)
            raise DownloadError(
                f"Model {entry.key} has no sha256 in the catalog, so draftpen's store cannot "
                "verify it; only the Hugging Face source can fetch it. Update draftpen."
            )
        if stat.st_size != entry.size_bytes or sha256.lower() != entry.sha256:
            partial.unlink(missing_ok=True)
            raise ChecksumMismatchError(
                f"The download of {entry.key} does not match the catalog: it has "
                f"{stat.st_size} bytes and sha256 {sha256}, the catalog expects "
                f"{entry.size_bytes} bytes and sha256 {entry.sha256}. It was deleted."
            )
        # The sidecar goes first: os.replace keeps the mtime it records, and a crash
        # between the two steps leaves a sidecar without a file, which reads as absent.
        self._write_sidecar(entry, stat)
        os.replace(partial, self.path_for(entry))
        return self.path_for(entry)

    def remove(self, entry: ModelEntry) -> int:
        """Delete ``entry`` from the store and the HF cache, partial downloads too.

        Returns the bytes freed. A user's own file is never deleted (0 bytes freed).
        """
        if entry.is_local:
            return 0
        return self._remove_local(entry) + self.hub.remove(entry)

    def _remove_local(self, entry: ModelEntry) -> int:
        if entry.format == "mlx":
            directory = self.converted_dir_for(entry)
            freed = tree_size(directory) if directory.exists() else 0
            shutil.rmtree(directory, ignore_errors=True)
            return freed
        freed = 0
        for path in (
            self.path_for(entry),
            self.sidecar_path_for(entry),
            self.partial_path_for(entry),
        ):
            try:
                freed += path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                pass
        return freed + self.remove_scratch(entry)

    def remove_scratch(self, entry: ModelEntry) -> int:
        """Delete temporary download directories a killed download left behind."""
        freed = 0
        if not self.root.is_dir():
            return 0
        for scratch in self.root.glob(scratch_prefix(entry) + "*"):
            freed += tree_size(scratch)
            shutil.rmtree(scratch, ignore_errors=True)
        return freed

    def _verify_converted(self, entry: ModelEntry) -> Path | None:
        directory = self.converted_dir_for(entry)
        if not directory.exists():
            return None
        if self.is_converted(entry):
            return directory
        shutil.rmtree(directory, ignore_errors=True)
        raise ChecksumMismatchError(
            f"The converted model directory {directory} is incomplete or was changed; "
            "it was deleted."
        )

    def _verify_now(
        self, entry: ModelEntry, stat: os.stat_result, progress: ProgressCallback
    ) -> Path:
        path = self.path_for(entry)
        if stat.st_size != entry.size_bytes:
            self._discard(
                entry, f"has {stat.st_size} bytes, the catalog expects {entry.size_bytes}"
            )
        actual = sha256_of_file(path, entry.key, progress)
        if actual != entry.sha256:
            self._discard(entry, f"has sha256 {actual}, the catalog expects {entry.sha256}")
        # `stat` was taken before hashing: if the file changes meanwhile, its mtime no
        # longer matches the sidecar and the next use hashes it again.
        self._write_sidecar(entry, stat)
        return path

    def _discard(self, entry: ModelEntry, problem: str) -> NoReturn:
        path = self.path_for(entry)
        path.unlink(missing_ok=True)
        self.sidecar_path_for(entry).unlink(missing_ok=True)
        raise ChecksumMismatchError(f"Model file {path} {problem}; it was deleted.")

    def _sidecar_matches(self, entry: ModelEntry, stat: os.stat_result) -> bool:
        try:
            record = json.loads(self.sidecar_path_for(entry).read_text(encoding="utf-8"))
            return bool(
                record["sha256"] == entry.sha256
                and record["size"] == entry.size_bytes == stat.st_size
                and record["mtime_ns"] == stat.st_mtime_ns
            )
        except (OSError, ValueError, KeyError, TypeError):
            # A missing or unreadable sidecar only means the file must be hashed again.
            return False

    def _write_sidecar(self, entry: ModelEntry, stat: os.stat_result) -> None:
        record = {"sha256": entry.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        sidecar = self.sidecar_path_for(entry)
        staging = sidecar.with_name(sidecar.name + PARTIAL_SUFFIX)
        staging.write_text(json.dumps(record) + "\n", encoding="utf-8")
        os.replace(staging, sidecar)


def user_file(entry: ModelEntry) -> Path | None:
    """A user's own GGUF file if it (and every shard of a split file) is still there, or
    their own MLX directory if it still holds its config.json and safetensors."""
    assert entry.sources.local is not None
    path = entry.sources.local.path
    if entry.format == "mlx":
        return path if is_complete(path) else None
    shards = [path.with_name(name) for name in shard_names(path.name)]
    return path if all(shard.is_file() for shard in shards) else None
