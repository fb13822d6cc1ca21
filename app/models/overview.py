"""What the models menu shows: every pair, each runtime variant, sizes, fit and state.

One function builds the rows both ``draftpen models list`` and the TUI's models screen
display, so the two never disagree. Cheap: it reads sidecars and records, never hashes.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.models.catalog import Catalog, ModelEntry, PairVariant
from app.models.fit import DEFAULT_CONTEXT, FitVerdict, MachineMemory, machine_memory, pair_fit
from app.models.pair_files import pair_state
from app.models.store import ModelState, ModelStore
from backends.select import choose_runtime


@dataclass(frozen=True)
class ModelRow:
    """One model of a variant."""

    role: str
    """``target`` or ``draft``."""
    entry: ModelEntry
    state: ModelState

    @property
    def size_bytes(self) -> int:
        """The catalog's size (exact where it has a sha256, else approximate)."""
        return self.entry.size_bytes


@dataclass(frozen=True)
class VariantRow:
    """A pair's models for one runtime, with its fit and download state."""

    variant: PairVariant
    models: tuple[ModelRow, ...]
    state: ModelState
    fit: FitVerdict
    is_this_machines_runtime: bool

    @property
    def runtime(self) -> str:
        """``llamacpp`` or ``mlx``."""
        return self.variant.runtime

    @property
    def size_bytes(self) -> int:
        """Target and draft together."""
        return sum(model.size_bytes for model in self.models)


@dataclass(frozen=True)
class PairRow:
    """One catalog pair: its name, what it is for, and its runtime variants."""

    name: str
    description: str
    variants: tuple[VariantRow, ...]
    recommend: bool = True  # the catalog's word (PairEntry.recommend)

    def variant(self, runtime: str) -> VariantRow | None:
        """The row for ``runtime``, if the pair has that variant."""
        return next((row for row in self.variants if row.runtime == runtime), None)


def pair_overview(
    catalog: Catalog,
    store: ModelStore,
    machine: MachineMemory | None = None,
    n_ctx: int = DEFAULT_CONTEXT,
) -> tuple[PairRow, ...]:
    """Every pair of the catalog, in catalog order, as the models menu lists it."""
    machine = machine or machine_memory()
    this_runtime = choose_runtime(None)
    rows = []
    for pair in catalog.pairs:
        variants = []
        for variant in pair.variants:
            entries = catalog.models_of(variant)
            models = tuple(
                ModelRow(role, entry, store.state(entry))
                for role, entry in zip(("target", "draft"), entries, strict=False)
            )
            variants.append(
                VariantRow(
                    variant=variant,
                    models=models,
                    state=pair_state(catalog, pair, store, variant.runtime),
                    fit=pair_fit(entries, machine, n_ctx),
                    is_this_machines_runtime=variant.runtime == this_runtime,
                )
            )
        rows.append(PairRow(pair.key, pair.description, tuple(variants), pair.recommend))
    return tuple(rows)
