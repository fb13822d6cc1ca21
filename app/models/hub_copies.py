"""Which catalog models already sit, complete and verified, in the Hugging Face cache.

The bytes live in the HF cache (shared with other tools); draftpen keeps a small record
per model in ``<store>/hub/<key>.json`` saying which snapshot files make up the model,
their sizes, and (for a gguf file) the sha256 it was verified against and its mtime, so
a start never re-hashes gigabytes. A record with ``"complete": false`` marks a download
that started and has not finished (the model is then ``partial``).

A gguf file that another tool put in the cache, with no record, is found through the
cache's refs and snapshots, hashed once and recorded. An mlx snapshot without a record
is not trusted (the cache cannot say whether every file arrived); ``pull`` lists it on
the hub and records it without re-downloading what is there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from app.errors import ChecksumMismatchError
from app.models.catalog import HuggingFaceFile, HuggingFaceRepo, ModelEntry
from app.models.hub_cache import HASH_CHUNK_BYTES, HubCache, HubFile, verify_blob

RECORDS_DIR = "hub"


class HubCopies:
    """Records of models fetched into ``cache``, kept under ``<store root>/hub``."""

    def __init__(self, store_root: Path, cache: HubCache) -> None:
        self.records = store_root / RECORDS_DIR
        self.cache = cache

    def record_path(self, entry: ModelEntry) -> Path:
        """The record of ``entry``'s copy in the HF cache."""
        return self.records / f"{entry.key}.json"

    def start(self, entry: ModelEntry, files: tuple[HubFile, ...]) -> None:
        """Note that a download of ``files`` began (``partial`` until :meth:`finish`)."""
        self._write(entry, {"complete": False, "files": [_file_record(f) for f in files]})

    def finish(
        self, entry: ModelEntry, files: tuple[HubFile, ...], sha256: str | None = None
    ) -> Path:
        """Record a complete, verified copy; returns the model's path (file or directory)."""
        records = []
        for file in files:
            record = _file_record(file)
            record["mtime_ns"] = self.cache.snapshot_path(file).stat().st_mtime_ns
            records.append(record)
        self._write(entry, {"complete": True, "sha256": sha256, "files": records})
        return self._model_path(entry, files[0])

    def path(self, entry: ModelEntry) -> Path | None:
        """The model's path in the HF cache if its record says complete and still holds."""
        record = self._read(entry)
        if record is None or not record.get("complete"):
            return None
        try:
            files = [_hub_file(item) for item in record["files"]]
            for file, item in zip(files, record["files"], strict=True):
                stat = self.cache.snapshot_path(file).stat()
                if stat.st_size != file.size or stat.st_mtime_ns != item["mtime_ns"]:
                    return None
            if entry.sha256 is not None and record.get("sha256") != entry.sha256:
                return None
            return self._model_path(entry, files[0])
        except (OSError, KeyError, TypeError, ValueError):
            return None

    def is_partial(self, entry: ModelEntry) -> bool:
        """Whether a hub download of ``entry`` started and left something behind."""
        record = self._read(entry)
        if record is None:
            return False
        if not record.get("complete"):
            return True
        # A completed record whose files changed: something is there, not all of it.
        return self.path(entry) is None

    def adopt(self, entry: ModelEntry) -> Path | None:
        """A gguf file another tool put in the HF cache: hash it once, record it if right.

        Only files whose checksum is known (catalog sha256, or the blob's own name, which
        huggingface_hub sets to the hub's LFS sha256) are adopted.
        """
        source = entry.sources.huggingface
        if not isinstance(source, HuggingFaceFile):
            return None
        files: list[HubFile] = []
        verified: list[str] = []
        # A split GGUF is adopted only whole: every shard there and every one right.
        for name in source.filenames:
            path = self.cache.cached_file(source.repo, name, source.revision)
            if path is None:
                return None
            blob = path.resolve()
            expected = (entry.sha256 if not files else None) or blob.name
            if len(expected) != 64 or _sha256_of(blob) != expected:
                return None  # not ours to delete: another tool may have other reasons
            commit = path.parent.name
            files.append(HubFile(source.repo, name, commit, blob.stat().st_size, blob.name))
            verified.append(expected)
        return self.finish(entry, tuple(files), sha256=verified[0])

    def verify(self, entry: ModelEntry) -> Path | None:
        """Re-check every recorded file against its checksum; ``None`` if there is no copy.

        A damaged file is deleted and :class:`ChecksumMismatchError` raised.
        """
        record = self._read(entry)
        if record is None or not record.get("complete"):
            return None
        files = [_hub_file(item) for item in record["files"]]
        for file in files:
            link = self.cache.snapshot_path(file)
            if not link.exists():
                self.remove(entry)
                raise ChecksumMismatchError(
                    f"{file.repo}/{file.filename} is missing from the Hugging Face cache."
                )
            try:
                verify_blob(link.resolve(), file)
            except ChecksumMismatchError:
                self.remove(entry)
                raise
        if entry.sha256 is not None and entry.format == "gguf":
            actual = _sha256_of(self.cache.snapshot_path(files[0]).resolve())
            if actual != entry.sha256:
                self.remove(entry)
                raise ChecksumMismatchError(
                    f"{files[0].repo}/{files[0].filename} has sha256 {actual}, the catalog "
                    f"expects {entry.sha256}; it was deleted."
                )
        self.finish(entry, tuple(files), sha256=record.get("sha256"))
        return self._model_path(entry, files[0])

    def remove(self, entry: ModelEntry) -> int:
        """Delete the model's files from the HF cache, partial ones too; returns bytes freed."""
        record = self._read(entry)
        freed = 0
        if record is not None:
            for item in record.get("files", []):
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    file = _hub_file(item)
                    freed += self.cache.remove(self.cache.snapshot_path(file))
                    partial = self.cache.incomplete_path(file)
                    with contextlib.suppress(OSError):
                        freed += partial.stat().st_size
                        partial.unlink()
        self.record_path(entry).unlink(missing_ok=True)
        return freed

    def _model_path(self, entry: ModelEntry, first: HubFile) -> Path:
        if isinstance(entry.sources.huggingface, HuggingFaceRepo) or entry.format == "mlx":
            return self.cache.snapshot_dir(first.repo, first.commit)
        return self.cache.snapshot_path(first)

    def _read(self, entry: ModelEntry) -> dict[str, Any] | None:
        try:
            record = json.loads(self.record_path(entry).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def _write(self, entry: ModelEntry, record: dict[str, Any]) -> None:
        path = self.record_path(entry)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(path.name + ".part")
        staging.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        os.replace(staging, path)


def _file_record(file: HubFile) -> dict[str, Any]:
    return {
        "repo": file.repo,
        "filename": file.filename,
        "commit": file.commit,
        "size": file.size,
        "etag": file.etag,
    }


def _hub_file(item: dict[str, Any]) -> HubFile:
    return HubFile(item["repo"], item["filename"], item["commit"], item["size"], item["etag"])


def _sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as reader:
        while chunk := reader.read(HASH_CHUNK_BYTES):
            hasher.update(chunk)
    return hasher.hexdigest()
