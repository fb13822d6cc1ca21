"""What ``draftpen models list`` and ``draftpen models scan`` print.

``list`` shows the catalog's pairs with their runtime variants, sizes, fit on this
machine and download state, and the pair recommended here; ``scan`` shows the GGUF
files already on this machine and which of them can pair. ``app.cli.models`` registers
both commands.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from app.models.catalog_file import load_catalog
from app.models.disk import format_bytes
from app.models.fit import DEFAULT_CONTEXT, MachineMemory, machine_memory
from app.models.overview import VariantRow, pair_overview
from app.models.recommend import recommend_pair
from app.models.sources.on_this_machine import FoundModel, ScanResult, scan
from app.models.store import ModelStore
from app.models.worker_memory import with_workers
from app.settings import load_settings, models_dir
from backends.select import choose_runtime


def list_pairs(args: argparse.Namespace) -> int:
    """Print every pair: runtime variants, sizes, fit on this machine, download state."""
    catalog = load_catalog()
    store = ModelStore(models_dir())
    machine, worker_lines = with_workers(machine_memory(), load_settings())
    out = sys.stdout
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
        f"  {row.runtime:<10} {row.state:<11} {format_bytes(row.size_bytes):>9}  "
        f"{row.fit.summary}{mark}",
        file=out,
    )
    for model in row.models:
        print(
            f"    {model.role:<8} {model.entry.name:<40} {format_bytes(model.size_bytes):>9}  "
            f"{model.state}",
            file=out,
        )
    if row.variant.draft is None:
        # No draft file: n-grams, or an MTP head kept inside the target GGUF.
        print(f"    {'draft':<8} none: drafts from {row.variant.drafting}", file=out)


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
