"""Which files a pair uses on this machine: the one place that answers it.

A pair's variant for a runtime names its models; the store says which of them are
downloaded and verified. That holds for the user's own pairs too (``draftpen models
add``, ``--target``/``--draft``): :func:`~app.models.catalog_file.load_catalog` merges
them into the catalog, and their local files resolve to where they lie, their hub
files to the HF cache, like any other. Loading a pair, the models screen, the ``models``
commands and the server all ask here (through :func:`pair_files`, or :func:`resolve_pair` with a
catalog and store of their own), never the store directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.errors import (
    ChecksumMismatchError,
    LocalModelMissingError,
    ModelNotDownloadedError,
)
from app.models.catalog import (
    BLOCK_HEAD_DRAFTERS,
    Catalog,
    ModelEntry,
    PairEntry,
    PairVariant,
)
from app.models.catalog_file import load_catalog
from app.models.store import (
    ModelState,
    ModelStore,
)
from app.settings import models_dir
from backends.select import choose_runtime


@dataclass(frozen=True)
class ResolvedPair:
    """A pair whose models are all present and verified, for one runtime.

    Paths are files for llamacpp (gguf) and directories for mlx. A variant whose
    drafter is a separate MTP file has that file in :attr:`mtp_head_path`, and one whose
    drafter is an EAGLE-3 head has it in :attr:`eagle3_head_path`, and one whose drafter
    is a DFlash or DSpark head in :attr:`dflash_head_path`, never in
    :attr:`draft_path`: neither is a model that can be loaded and run alone.
    """

    target_path: Path
    draft_path: Path | None
    entry: PairEntry
    runtime: str
    mtp_head_path: Path | None = None
    eagle3_head_path: Path | None = None
    dflash_head_path: Path | None = None

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
        if path is None and entry.sources.local is not None:
            raise LocalModelMissingError(pair.key, str(entry.sources.local.path))
        if path is None:
            raise ModelNotDownloadedError(pair.key)
        paths.append(path)
    second = paths[1] if len(paths) > 1 else None
    return ResolvedPair(
        target_path=paths[0],
        draft_path=second if variant.draft_model is not None else None,
        entry=pair,
        runtime=variant.runtime,
        mtp_head_path=second if variant.uses_mtp else None,
        eagle3_head_path=second if variant.uses_eagle3 else None,
        dflash_head_path=second if variant.drafter in BLOCK_HEAD_DRAFTERS else None,
    )


def pair_state(
    catalog: Catalog, pair: PairEntry, store: ModelStore, runtime: str | None = None
) -> ModelState:
    """``downloaded`` when every model of the pair's variant is, ``absent`` when none is."""
    states = {store.state(entry) for entry in catalog.models_of(pair_variant(pair, runtime))}
    return states.pop() if len(states) == 1 else "partial"


def pair_models(
    catalog: Catalog, pair_name: str, runtime: str | None = None
) -> tuple[ModelEntry, ...]:
    """The models (target first, then the draft if any) of a pair's variant for ``runtime``."""
    return catalog.models_of(pair_variant(catalog.pair(pair_name), runtime))


def pair_files(pair_name: str, runtime: str | None = None) -> ResolvedPair:
    """The verified files of ``pair_name`` for ``runtime`` (default: this machine's choice).

    Reads the user's catalog and model store. Raises :class:`ModelNotDownloadedError`
    naming the ``draftpen models pull`` command when a file is missing.
    """
    return resolve_pair(load_catalog(), pair_name, ModelStore(models_dir()), runtime)
