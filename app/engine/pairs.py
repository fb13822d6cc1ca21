"""The pairs the engine can serve: the catalog's downloaded pairs, and how to load one.

``GET /v1/models`` lists what :meth:`PairDirectory.downloaded` returns; a request naming
anything else is answered 404 by :meth:`PairDirectory.check`, with a message that says
how to get the pair. The catalog and the store are read on every call (both are cheap
to read: sidecar files, no hashing), so a pair downloaded while the engine runs is
served without a restart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from app.engine.crash_record import load_watched
from app.engine.scheduler import LoadOptions, PairLoader
from app.engine.schema import ApiError
from app.errors import DraftpenError
from backends.caches.draft_history import HistorySettings
from backends.caches.prefix_store import PrefixStore
from backends.engine import Engine
from backends.errors import BackendError
from backends.select import RankSplit

if TYPE_CHECKING:
    from app.models.catalog import Catalog


@dataclass(frozen=True)
class PairEntryInfo:
    """A pair the engine could load: its name and its models' names."""

    name: str
    target: str
    draft: str | None


class PairDirectory(Protocol):
    """Which pairs can be served."""

    def downloaded(self) -> list[PairEntryInfo]:
        """The pairs whose files are all here, for this engine's runtime."""
        ...

    def check(self, name: str) -> None:
        """Nothing if ``name`` can be loaded; else an :class:`ApiError` (404) naming the fix."""
        ...

    def share(self, name: str, target: str, draft: str | None) -> Catalog:
        """Make a client's ``--target``/``--draft`` files pair ``name`` here; its catalog
        (for the runtime process). An :class:`ApiError` (400) naming the fix when not."""
        ...


def model_not_found(message: str) -> ApiError:
    """The 404 of a request naming a pair that cannot be served."""
    return ApiError(404, message, param="model", code="model_not_found")


class CatalogPairs:
    """The catalog's pairs (the user's own included) that are downloaded for ``runtime``."""

    def __init__(self, runtime: str) -> None:
        self.runtime = runtime

    def downloaded(self) -> list[PairEntryInfo]:
        """Every pair of the catalog whose models are all downloaded and verified."""
        from app.models.catalog_file import load_catalog
        from app.models.pair_files import pair_models, pair_state
        from app.models.store import ModelStore
        from app.settings import models_dir

        catalog = load_catalog()
        store = ModelStore(models_dir())
        found = []
        for pair in catalog.pairs:
            if self.runtime not in pair.runtimes:
                continue
            if pair_state(catalog, pair, store, self.runtime) != "downloaded":
                continue
            models = pair_models(catalog, pair.key, self.runtime)
            draft = models[1].key if len(models) > 1 else None
            found.append(PairEntryInfo(pair.key, models[0].key, draft))
        return found

    def check(self, name: str) -> None:
        """404 for a pair that is unknown, not downloaded, or has no variant here."""
        from app.models.catalog_file import load_catalog
        from app.models.pair_files import pair_files

        try:
            pair_files(name, self.runtime)
        except DraftpenError as error:
            known = ", ".join(pair.name for pair in self.downloaded()) or "none yet"
            if name not in {pair.key for pair in load_catalog().pairs}:
                raise model_not_found(
                    f"The model '{name}' is not a draftpen pair. Downloaded pairs: {known} "
                    "(GET /v1/models lists them; draftpen models list shows every pair)."
                ) from None
            raise model_not_found(f"{error} Downloaded pairs: {known}.") from None

    def share(self, name: str, target: str, draft: str | None) -> Catalog:
        """The client's files become command-line pair ``name`` of this engine, checked
        as the client checked them (``command_line_pairs``)."""
        from app.models.command_line_pairs import share_command_line_pair

        try:
            return share_command_line_pair(name, target, draft)
        except (DraftpenError, BackendError) as error:  # a missing file, a clash, a vocabulary
            raise ApiError(400, str(error), param="files", code="invalid_value") from None


def catalog_loader(
    runtime: str | None,
    *,
    conversation_cache_bytes: int = 0,
    prefix_store: PrefixStore | None = None,
    history: HistorySettings | None = None,
    split: RankSplit | None = None,
) -> PairLoader:
    """Loads a catalog pair with its draft model and this machine's measured costs.

    ``conversation_cache_bytes`` > 0: the engine keeps that much of conversations' KV
    state, so interleaved conversations do not re-read their prompts. ``prefix_store``:
    prompts' prefixes are kept on disk for later engines too. ``history``: every reply
    is remembered (per tokenizer, on disk too) and the n-gram drafter drafts from it.
    The options' ``workers`` hold part of the target's layers (``serve --workers``);
    ``split``: the target is split across mlx.launch's ranks, this being rank 0
    (app/engine/mlx_split.py).
    """

    def load(name: str, options: LoadOptions, report: Callable[[str], None]) -> Engine:
        from app.loading import load_engine

        # Recorded as "loading": a runtime that crashes here is reported with the pair.
        return load_watched(
            name,
            lambda: load_engine(
                name,
                n_ctx=options.context_length,
                runtime=runtime,
                exact_output=options.exact,
                parallel=options.parallel,
                conversation_cache_bytes=conversation_cache_bytes,
                prefix_store=prefix_store,
                history=history,
                on_progress=report,
                workers=options.workers,
                split=split,
            ),
        )

    return load


class FixedPairs:
    """One pair whose engine was loaded by the caller (tests, embedding programs)."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine

    def downloaded(self) -> list[PairEntryInfo]:
        """The one pair."""
        draft = self.engine.draft.name if self.engine.draft is not None else None
        return [PairEntryInfo(self.name, self.engine.target.name, draft)]

    def check(self, name: str) -> None:
        """404 for any other name."""
        if name != self.name:
            raise model_not_found(
                f"The model '{name}' is not served here; this engine serves '{self.name}' "
                "(see GET /v1/models)."
            )

    def share(self, name: str, target: str, draft: str | None) -> Catalog:
        """Refused: this engine serves its one pair."""
        raise ApiError(
            400,
            f"This engine serves the one model '{self.name}' it was given; it cannot load "
            f"{target} as '{name}'.",
            param="files",
            code="invalid_value",
        )

    def loader(self, name: str, options: LoadOptions, report: Callable[[str], None]) -> Engine:
        """A fixed pair cannot be loaded again once it has been unloaded."""
        raise DraftpenError(
            f"This engine serves the one model '{self.name}' it was given and cannot load "
            "it again with other settings."
        )
