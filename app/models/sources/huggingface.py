"""The Hugging Face hub as a model source: gguf files and mlx snapshots, into the HF cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.errors import (
    ChecksumMismatchError,
    DownloadError,
)
from app.models.catalog import (
    HuggingFaceFile,
    HuggingFaceRepo,
    ModelEntry,
)
from app.models.hub import HubClient, HubSettings
from app.models.hub_cache import HubFile
from app.models.store import ModelStore, ProgressCallback, sha256_of_file


class HuggingFaceSource:
    """The Hugging Face hub: a gguf file, or an mlx repository snapshot, into the HF cache.

    Downloads resume from the partial blob a failed or cancelled pull left. Settings
    (HF_ENDPOINT, HF_HOME, HF_TOKEN, HF_HUB_OFFLINE) are read when the source is made.
    """

    name = "huggingface"

    def __init__(self, settings: HubSettings | None = None) -> None:
        self.client = HubClient(settings)
        self._listings: dict[str, tuple[HubFile, ...]] = {}
        # An unreachable hub is asked once per pull, not again for the download itself.
        self._failures: dict[str, DownloadError] = {}

    def available_for(self, entry: ModelEntry) -> bool:
        """Whether the catalog names a hub repository for ``entry``."""
        return entry.sources.huggingface is not None

    def files_for(self, entry: ModelEntry) -> tuple[HubFile, ...]:
        """The hub files that make up ``entry`` (asked once per source, then remembered)."""
        if entry.key in self._failures:
            raise self._failures[entry.key]
        try:
            return self._list(entry)
        except DownloadError as error:
            self._failures[entry.key] = error
            raise

    def _list(self, entry: ModelEntry) -> tuple[HubFile, ...]:
        if entry.key not in self._listings:
            source = entry.sources.huggingface
            if isinstance(source, HuggingFaceFile):
                # A split GGUF is every shard; they must come from one commit, so that
                # they sit in one snapshot directory where llama.cpp finds them.
                files = tuple(
                    self.client.file(source.repo, name, source.revision)
                    for name in source.filenames
                )
                if len({file.commit for file in files}) > 1:
                    raise DownloadError(
                        f"The shards of {source.repo}/{source.filename} changed on the hub "
                        "while draftpen listed them. Pull again."
                    )
                file = files[0]
                if entry.sha256 is not None and file.sha256 not in (None, entry.sha256):
                    raise DownloadError(
                        f"The hub's {source.repo}/{source.filename} has sha256 {file.sha256}, "
                        f"but draftpen's catalog expects {entry.sha256}: the file changed on "
                        "the hub. Update draftpen (or pin a revision in the catalog)."
                    )
                self._listings[entry.key] = files
            elif isinstance(source, HuggingFaceRepo):
                self._listings[entry.key] = self.client.snapshot_files(source.repo, source.revision)
            else:
                raise DownloadError(f"Model {entry.key} has no Hugging Face source.")
        return self._listings[entry.key]

    def required_bytes(self, entry: ModelEntry, store: ModelStore) -> tuple[Path, int, int]:
        """``(directory, bytes still to write there, temporary bytes)`` for ``entry``."""
        needed = 0
        for file in self.files_for(entry):
            blob = store.hub_cache.blob_path(file)
            partial = store.hub_cache.incomplete_path(file)
            if blob.exists():
                continue
            have = partial.stat().st_size if partial.exists() else 0
            needed += max(file.size - have, 0)
        return store.hub_cache.root, needed, 0

    def fetch(self, entry: ModelEntry, store: ModelStore, progress: ProgressCallback) -> Path:
        """Download every file of ``entry`` into the HF cache, verify, and record the copy."""
        source = entry.sources.huggingface
        assert source is not None
        files = self.files_for(entry)
        store.hub.start(entry, files)
        counter = _ByteCounter(entry.key, sum(file.size for file in files), progress)
        for file in files:
            self.client.download(file, store.hub_cache, counter.file_started(file.size))
        store.hub_cache.record_ref(source.repo, source.revision, files[0].commit)
        sha256 = files[0].sha256 if entry.format == "gguf" else None
        if entry.format == "gguf" and entry.sha256 is not None and sha256 != entry.sha256:
            # The hub published no LFS sha256 for this file: hash it against the catalog.
            blob = store.hub_cache.blob_path(files[0])
            actual = sha256_of_file(blob, entry.key, progress)
            if actual != entry.sha256:
                store.hub.remove(entry)
                raise ChecksumMismatchError(
                    f"The download of {entry.key} has sha256 {actual}, the catalog expects "
                    f"{entry.sha256}. It was deleted."
                )
            sha256 = actual
        return store.hub.finish(entry, files, sha256=sha256)


class _ByteCounter:
    """Adds up the bytes of a model's files into one ``download`` progress stage."""

    def __init__(self, model_key: str, total: int, progress: ProgressCallback) -> None:
        self.model_key = model_key
        self.total = total
        self.progress = progress
        self.finished_files = 0
        self.current = 0
        self.current_size = 0

    def file_started(self, size: int) -> Callable[[int], None]:
        """The byte callback for the next file (it may first report bytes already there)."""
        self.finished_files += self.current_size
        self.current, self.current_size = 0, size
        return self._add

    def _add(self, count: int) -> None:
        self.current = min(self.current + count, self.current_size)
        done = self.finished_files + self.current
        self.progress(self.model_key, "download", done, self.total)
