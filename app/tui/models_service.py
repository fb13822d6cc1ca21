"""What the models screen needs from the catalog, the store and the downloader.

One small object, so the screen holds no download logic and tests can hand the real one
a catalog and a store of their own (pointed at a local hub).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from app.models.catalog import Catalog, PairVariant
from app.models.catalog_file import load_catalog
from app.models.disk import format_bytes
from app.models.fit import MachineMemory, machine_memory
from app.models.overview import pair_overview
from app.models.pair_download import PullEventCallback, download_pair
from app.models.pair_files import pair_models
from app.models.recommend import Recommendation, recommend_pair
from app.models.sources.on_this_machine import ScanPlaces, ScanResult, scan
from app.models.store import ModelStore
from app.models.worker_memory import with_workers
from app.settings import load_settings, models_dir
from backends.select import choose_runtime


@dataclass(frozen=True)
class PairListing:
    """One pair as the models screen lists it, for this machine's runtime."""

    name: str
    description: str
    runtime: str
    target_bytes: int
    draft_bytes: int | None
    fit: str
    fits: bool
    # downloaded, partial, absent, or "no <runtime> models"; "loaded" when the engine
    # holds it (the models screen asks the engine).
    state: str
    # The pair recommend_pair picks for this machine (models list marks the same one).
    recommended: bool = False

    @property
    def available(self) -> bool:
        """Whether the pair has models for this runtime at all."""
        return self.state in ("loaded", "downloaded", "partial", "absent")

    @property
    def usable(self) -> bool:
        """Whether the engine can load it now (all its files are here)."""
        return self.state in ("loaded", "downloaded")

    @property
    def sizes(self) -> str:
        """Target and draft sizes, e.g. ``1.1 GB + 491 MB`` ("" when not known)."""
        if not self.target_bytes:
            return ""
        if self.draft_bytes is None:
            return f"{format_bytes(self.target_bytes)} (no draft)"
        return f"{format_bytes(self.target_bytes)} + {format_bytes(self.draft_bytes)}"


class ModelsService:
    """Lists, downloads and removes pairs for one runtime (default: this machine's)."""

    def __init__(
        self,
        catalog: Catalog | None = None,
        store: ModelStore | None = None,
        runtime: str | None = None,
        machine: MachineMemory | None = None,
        *,
        check_tokenizers: bool = True,
        scan_places: ScanPlaces | None = None,
    ) -> None:
        self.catalog = catalog if catalog is not None else load_catalog()
        self.store = store if store is not None else ModelStore(models_dir())
        self.runtime = runtime if runtime is not None else choose_runtime(None)
        # The workers setting's workers count too: a pair may fit only across machines.
        self.machine = (
            machine if machine is not None else with_workers(machine_memory(), load_settings())[0]
        )
        self.check_tokenizers = check_tokenizers
        # Where scan() looks (None: this user's HF cache, LM Studio and Ollama folders).
        self.scan_places = scan_places
        # Set by rows(): the pair to run on this machine, and why.
        self.recommendation: Recommendation | None = None

    def rows(self) -> list[PairListing]:
        """Every pair in the catalog with sizes, fit verdict, download state, recommendation."""
        listings = []
        overview = pair_overview(self.catalog, self.store, self.machine)
        self.recommendation = recommend_pair(overview, self.machine, self.runtime)
        best = self.recommendation.pair if self.recommendation else None
        for pair in overview:
            row = pair.variant(self.runtime)
            if row is None:
                listings.append(
                    PairListing(
                        pair.name,
                        pair.description,
                        self.runtime,
                        0,
                        None,
                        "",
                        False,
                        f"no {self.runtime} models",
                    )
                )
                continue
            sizes = [model.size_bytes for model in row.models]
            listings.append(
                PairListing(
                    name=pair.name,
                    description=pair.description,
                    runtime=self.runtime,
                    target_bytes=sizes[0],
                    draft_bytes=sizes[1] if len(sizes) > 1 else None,
                    fit=row.fit.summary,
                    fits=row.fit.fits,
                    state=row.state,
                    recommended=pair.name == best,
                )
            )
        return listings

    def scan(self) -> ScanResult:
        """GGUF files already on this machine and which can pair (``draftpen models scan``)."""
        return scan(self.scan_places)

    def variant(self, pair_name: str) -> PairVariant:
        """The pair's models for this runtime."""
        return self.catalog.pair(pair_name).variant(self.runtime)

    def download(
        self, pair_name: str, on_event: PullEventCallback, cancel: threading.Event
    ) -> None:
        """Download and check a pair (blocking: run it in a worker thread)."""
        download_pair(
            self.catalog,
            pair_name,
            self.store,
            runtime=self.runtime,
            on_event=on_event,
            cancel=cancel,
            check_tokenizers=self.check_tokenizers,
        )

    def remove(self, pair_name: str) -> int:
        """Delete the pair's files (partial downloads too); returns the bytes freed."""
        entries = pair_models(self.catalog, pair_name, self.runtime)
        return sum(self.store.remove(entry) for entry in entries)
