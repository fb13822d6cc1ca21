"""What ``draftpen models list`` and ``draftpen models scan`` print.

``list`` shows the catalog's pairs with their runtime variants, what drafts in each
(model, mtp, eagle3, dflash, dspark, ngram), sizes, fit on this machine and download
state, and the pair recommended here (``--json``: the same as data); ``scan`` shows the GGUF
files already on this machine and which of them can pair. ``app.cli.models`` registers
both commands.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any, TextIO

from app.models.catalog import PairVariant
from app.models.catalog_file import load_catalog
from app.models.disk import format_bytes
from app.models.fit import DEFAULT_CONTEXT, MachineMemory, machine_memory
from app.models.overview import PairRow, VariantRow, pair_overview
from app.models.recommend import Recommendation, recommend_pair
from app.models.sources.on_this_machine import FoundModel, ScanResult, scan
from app.models.store import ModelStore
from app.models.worker_memory import with_workers
from app.settings import load_settings, models_dir
from backends.select import choose_runtime


def list_pairs(args: argparse.Namespace) -> int:
    """Print every pair: runtime variants, drafters, sizes, fit here, download state
    (with ``--json``, the same as one JSON object)."""
    catalog = load_catalog()
    store = ModelStore(models_dir())
    machine, worker_lines = with_workers(machine_memory(), load_settings())
    out = sys.stdout
    if getattr(args, "json", False):
        rows = pair_overview(catalog, store, machine)
        best = recommend_pair(rows, machine, choose_runtime(None))
        print(json.dumps(listing_json(rows, best, store, machine), indent=2), file=out)
        return 0
    print(f"Model store: {store.root}   Hugging Face cache: {store.hub_cache.root}", file=out)
    print(
        f"This machine: {_describe_machine(machine)}; fit at {DEFAULT_CONTEXT} tokens of context",
        file=out,
    )
    for line in worker_lines:
        print(f"  {line}", file=out)
    rows = pair_overview(catalog, store, machine)
    runtime = choose_runtime(None)
    best = recommend_pair(rows, machine, runtime)
    if best is None:
        print("No pair fits this machine's memory (each pair's fit is below).", file=out)
    else:
        print(f"Recommended here: {best.pair} ({best.runtime}), {best.reason}.", file=out)
    print(file=out)
    print(f"  {'runtime':<10} {'drafter':<8} {'state':<11} {'size':>9}  fit", file=out)
    for pair in rows:
        print(file=out)
        mark = "  * recommended for this machine" if best and pair.name == best.pair else ""
        print(f"{pair.name:<10} {pair.description}{mark}", file=out)
        for variant in pair.variants:
            _print_variant(variant, out)
    return 0


def _describe_machine(machine: MachineMemory) -> str:
    gpu = "no GPU"
    if machine.gpu_name and machine.vram_bytes:
        memory = "unified memory" if machine.unified else "VRAM"
        gpu = f"{machine.gpu_name}, {format_bytes(machine.vram_bytes)} {memory} for the GPU"
    return f"RAM {format_bytes(machine.ram_bytes)}, {gpu}"


def _print_variant(row: VariantRow, out: TextIO) -> None:
    mark = "  (this machine's runtime)" if row.is_this_machines_runtime else ""
    print(
        f"  {row.runtime:<10} {drafter_of(row.variant):<8} {row.state:<11} "
        f"{format_bytes(row.size_bytes):>9}  {row.fit.summary}{mark}",
        file=out,
    )
    for model in row.models:
        print(
            f"    {_role(row.variant, model.role):<8} {model.entry.name:<40} "
            f"{format_bytes(model.size_bytes):>9}  {model.state}",
            file=out,
        )
    if row.variant.draft is None:
        # No draft file: n-grams, or an MTP head kept inside the target GGUF.
        print(f"    {'draft':<8} none: drafts from {row.variant.drafting}", file=out)


def drafter_of(variant: PairVariant) -> str:
    """What drafts for a variant, in one word: model, mtp, eagle3, dflash, dspark, ngram."""
    return variant.drafter or "ngram"


def _role(variant: PairVariant, role: str) -> str:
    # The second file of a head pair is a head that reads the target, not a model.
    return "head" if role == "draft" and variant.draft_model is None else role


def listing_json(
    rows: tuple[PairRow, ...],
    best: Recommendation | None,
    store: ModelStore,
    machine: MachineMemory,
) -> dict[str, Any]:
    """``models list --json``: the same facts as the table, as data."""
    return {
        "model_store": str(store.root),
        "machine": asdict(machine),
        "recommended": None if best is None else asdict(best),
        "pairs": [
            {
                "name": pair.name,
                "description": pair.description,
                "variants": [
                    {
                        "runtime": row.runtime,
                        "drafter": drafter_of(row.variant),
                        "drafting": row.variant.drafting,
                        "state": row.state,
                        "size_bytes": row.size_bytes,
                        "fits": row.fit.fits,
                        "fit": row.fit.summary,
                        "this_machines_runtime": row.is_this_machines_runtime,
                        "models": [
                            {
                                "role": _role(row.variant, model.role),
                                "key": model.entry.key,
                                "name": model.entry.name,
                                "architecture": model.entry.architecture,
                                "size_bytes": model.size_bytes,
                                "state": model.state,
                            }
                            for model in row.models
                        ],
                    }
                    for row in pair.variants
                ],
            }
            for pair in rows
        ],
    }


def scan_command_handler(args: argparse.Namespace) -> int:
    """List the GGUF models on this machine and which of them can pair."""
    result = scan()
    print_scan(result, sys.stdout)
    return 0


def print_scan(result: ScanResult, out: TextIO) -> None:
    """The scan as ``draftpen models scan`` prints it."""
    if not result.models:
        print(
            "No GGUF models found in the Hugging Face cache, LM Studio's models folder or "
            "Ollama's store.",
            file=out,
        )
    else:
        print(f"GGUF models on this machine ({len(result.models)}):", file=out)
        for number, model in enumerate(result.models, 1):
            print(f"  [{number}] {_describe(model)}", file=out)
            print(f"      {model.path}", file=out)
    for path, reason in result.skipped:
        print(f"  skipped {path}: {reason}", file=out)
    if not result.pairings:
        return
    print(file=out)
    print("Pairs (target + smaller draft), by llama.cpp's vocabulary rule:", file=out)
    for line in result.verdict_lines():
        print(f"  {line}", file=out)
    print(file=out)
    print("Any target also runs alone, with n-gram drafts: draftpen chat --target PATH", file=out)


def _describe(model: FoundModel) -> str:
    return (
        f"{model.label} ({model.place}): {model.header.architecture}, "
        f"{len(model.header.tokens)} tokens, {format_bytes(model.size_bytes)}"
    )
