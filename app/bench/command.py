"""``draftpen bench``: does speculation pay on this machine, and by how much?

Everything runs on ONE loaded pair, in alternation (plain, draft model, n-gram for
each prompt in turn), so background noise hits every mode alike. All runs are
greedy, so the modes write the same text and their speeds compare like for like.

Besides end-to-end speed, bench measures the costs that decide the answer: a
target forward of 1, 2, 4, 8 and 16 tokens and one draft step. From them it prints
the *ceiling*: the speedup a free drafter that is always right would reach at each
K, ``(K + 1) * cost(1) / cost(K + 1)``. On a compute-bound CPU that ceiling is low.
"auto" is the adaptive controller the app uses by default.

``--engine`` runs the same suite through the engine instead (``through_engine``): the
figures are then the engine's loop as its clients see it; forward costs, ceilings and
llama-cpp-python's yardsticks need the pair in this process and are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.bench.modes import (
    BenchMode,
    LocalDecoder,
    ModeTotals,
    Yardstick,
    bench_modes,
    paired_ratios,
    parse_mode_choice,
    run_modes,
)
from app.bench.report import CEILING_DRAFT_LENGTHS, COST_REPEATS, format_report, projected_speedup
from app.bench.suite import BenchPrompt, load_prompt_suite
from app.errors import DraftpenError
from app.machine import machine_description
from app.options import add_model_options
from app.settings import Settings
from backends.engine import Engine
from backends.speculation.calibration import disturbed, measure_costs
from backends.speculation.cost_model import CostModel
from backends.workers.cluster import Workers

FORWARD_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16)


@dataclass
class BenchRun:
    """What one run of the suite measured, wherever it ran."""

    modes: list[BenchMode]
    results: dict[str, dict[str, ModeTotals]]
    # Forward costs: measured in this process only (None through the engine).
    costs: CostModel | None
    draft_size_ratio: float
    yardstick_names: list[str] = field(default_factory=list)
    # Where it ran: "this process", or the engine (its pid, version, socket).
    where: dict[str, Any] = field(default_factory=dict)
    # What auto corrected in the measured figures as it ran (cost_audit.py), in words.
    corrections: list[str] = field(default_factory=list)


def run_benchmark(args: argparse.Namespace) -> int:
    """Entry point of ``draftpen bench``."""
    from app.settings import load_settings

    settings = load_settings()
    pair = args.pair or settings.default_pair
    prompts = load_prompt_suite(args.category or None)
    chosen = parse_mode_choice(args.modes)
    if args.engine:
        run = _run_through_engine(args, settings, pair, prompts, chosen)
    else:
        run = _run_in_process(args, settings, pair, prompts, chosen)
    results, costs = run.results, run.costs
    labels = [mode.label for mode in run.modes] + run.yardstick_names
    drafter_of = {mode.label: mode.drafter for mode in run.modes}
    projections = {
        category: {
            label: projected_speedup(
                totals, by_mode["plain"], run.draft_size_ratio, drafter_of.get(label, "yardstick")
            )
            for label, totals in by_mode.items()
        }
        for category, by_mode in results.items()
    }
    report = {
        "pair": pair,
        "machine": machine_description(),
        "through": run.where,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "repeats": args.repeats,
        "costs_ms": None
        if costs is None
        else {
            "target_forward": {n: s * 1000 for n, s in costs.target_seconds.items()},
            "draft_step": (costs.draft_step_seconds or 0.0) * 1000,
        },
        "exact_batch_limit": costs.exact_batch_limit if costs is not None else None,
        "costs_corrected": run.corrections,
        "ceilings": {k: costs.ceiling(k) for k in CEILING_DRAFT_LENGTHS} if costs else None,
        "draft_size_ratio": run.draft_size_ratio,
        "results": {
            category: {
                label: {
                    **asdict(totals),
                    "tokens_per_second": totals.tokens_per_second,
                    "ratio_to_plain": totals.tokens_per_second / by_mode["plain"].tokens_per_second,
                    "paired_ratios": paired_ratios(by_mode, label),
                    "speedup_over_own_plain_rounds": totals.speedup_over_own_plain_rounds,
                    "acceptance_rate": totals.acceptance_rate,
                    "host_ms_per_token": totals.host_ms_per_token,
                    "mean_accepted_length": totals.mean_accepted_length,
                    "projected_memory_bound_speedup": projections[category][label],
                }
                for label, totals in by_mode.items()
            }
            for category, by_mode in results.items()
        },
    }
    text = format_report(
        results, labels, costs, projections, where=run.where, corrections=run.corrections
    )
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        output.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(text)
    return 0


def _run_in_process(
    args: argparse.Namespace,
    settings: Settings,
    pair: str,
    prompts: list[BenchPrompt],
    chosen: set[str],
) -> BenchRun:
    """Load the pair here and run the suite on it: the loop itself, nothing between."""
    from app.loading import load_engine

    print(f"draftpen bench: loading {pair} ...", file=sys.stderr)
    n_ctx = args.context or settings.context_length
    exact_kernels = settings.exact_output if args.exact is None else args.exact
    workers = Workers.parse(args.workers, args.worker_split) if args.workers else None
    engine = load_engine(
        pair,
        n_ctx=n_ctx,
        runtime=args.runtime,
        calibrate=False,
        exact_output=exact_kernels,
        workers=workers,
    )
    yardsticks: list[Yardstick] = []
    try:
        modes = bench_modes(
            chosen,
            has_draft=engine.draft is not None,
            exact=exact_kernels,
            constrained=any(prompt.constrained for prompt in prompts),
        )
        if "reference" in chosen and not args.no_yardsticks:
            yardsticks = _load_yardsticks(engine, n_ctx)
        print("measuring forward costs ...", file=sys.stderr)
        costs = measure_costs(
            engine.target, engine.draft, sizes=FORWARD_SIZES, repeats=COST_REPEATS
        )
        why = disturbed(costs)
        if why is not None:
            print(
                f"the machine looked busy while measuring ({why}): auto checks the "
                "figures as it runs",
                file=sys.stderr,
            )
        # auto refines the engine's costs as it runs; the report keeps what was measured.
        engine.costs = costs.copy()
        print(
            f"running {len(prompts)} prompts x {len(modes) + len(yardsticks)} modes ...",
            file=sys.stderr,
        )
        results = run_modes(
            LocalDecoder(engine),
            prompts,
            modes,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            yardsticks=yardsticks,
            temperature=args.temperature,
        )
        size_ratio = _draft_size_ratio(engine)
        corrections = [correction.describe() for correction in engine.costs.corrections]
    finally:
        for yardstick in yardsticks:
            yardstick.close()
        engine.close()
    where = {"process": "this process"}
    if workers is not None:
        where["target"] = str(getattr(engine.target, "placement", ""))
    return BenchRun(
        modes,
        results,
        costs,
        size_ratio,
        [yardstick.name for yardstick in yardsticks],
        where,
        corrections,
    )


def _run_through_engine(
    args: argparse.Namespace,
    settings: Settings,
    pair: str,
    prompts: list[BenchPrompt],
    chosen: set[str],
) -> BenchRun:
    """Run the suite through the engine (started if none runs), as its clients see it."""
    from app.bench.through_engine import EngineDecoder
    from app.client import ensure_engine
    from app.models.command_line_pairs import command_line_pair_files

    def note(text: str) -> None:
        print(f"draftpen bench: {text}", file=sys.stderr, flush=True)

    serve_options = ("--runtime", args.runtime) if args.runtime else ()
    client = ensure_engine(settings, on_status=note, serve_options=serve_options)
    with client.attach():  # an engine started for us stays until we are done
        note(f"the engine loads {pair} ...")
        loaded = client.load(
            pair,
            on_progress=lambda text: note(f"  {text}"),
            context_length=args.context,
            exact=args.exact,
            # A --target/--draft pair is this process's: the engine learns it from its files.
            files=command_line_pair_files(pair),
        )
        health = client.health()
        modes = bench_modes(
            chosen,
            has_draft=loaded.draft is not None,
            exact=loaded.exact,
            constrained=any(prompt.constrained for prompt in prompts),
        )
        if "reference" in chosen:
            note("llama-cpp-python's own decoders run in-process only: left out with --engine")
        note(f"running {len(prompts)} prompts x {len(modes)} modes through the engine ...")
        decoder = EngineDecoder(client, pair)
        results = run_modes(
            decoder,
            prompts,
            modes,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            temperature=args.temperature,
        )
    if decoder.waited:
        note(
            f"{decoder.waited} requests waited in the engine's queue behind other clients' "
            "work; their figures are the loop's own, but the machine was shared meanwhile"
        )
    where = {
        "process": "engine",
        "socket": str(client.socket_path),
        "pid": health.pid,
        "version": health.version,
        "context_length": loaded.context_length,
        "exact_kernels": loaded.exact,
        "requests_that_waited": decoder.waited,
    }
    return BenchRun(modes, results, None, _catalog_draft_size_ratio(pair), [], where)


def _load_yardsticks(engine: Engine, n_ctx: int) -> list[Yardstick]:
    path = getattr(engine.target, "path", None)
    if path is None or path.suffix != ".gguf":
        return []  # the yardsticks are llama.cpp's, and read GGUF files only
    try:
        from backends.llamacpp.reference import LlamaCppReference
    except ImportError:
        return []
    print("loading llama-cpp-python's own decoders as yardsticks ...", file=sys.stderr)
    return [
        LlamaCppReference(path, n_ctx=min(n_ctx, 2048)),
        LlamaCppReference(path, n_ctx=min(n_ctx, 2048), prompt_lookup=True),
    ]


def _catalog_draft_size_ratio(pair: str) -> float:
    """Draft over target size, from the catalog (the engine's models are not here)."""
    from app.models.catalog_file import load_catalog
    from app.models.pair_files import pair_models

    try:
        models = pair_models(load_catalog(), pair)
    except DraftpenError:
        return 0.0
    if len(models) < 2 or not models[0].size_bytes:
        return 0.0
    return models[1].size_bytes / models[0].size_bytes


def _draft_size_ratio(engine: Engine) -> float:
    target_size = getattr(engine.target, "size_bytes", 0)
    draft_size = getattr(engine.draft, "size_bytes", 0) if engine.draft is not None else 0
    return draft_size / target_size if target_size else 0.0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``bench`` to the ``draftpen`` command."""
    bench = commands.add_parser("bench", help="measure whether speculation pays on this machine")
    add_model_options(bench)
    bench.add_argument(
        "--no-yardsticks",
        action="store_true",
        help="skip llama-cpp-python's own decoders (saves memory and time)",
    )
    bench.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="load exact kernels and add an 'auto, exact' mode (default: the exact_output setting)",
    )
    bench.add_argument(
        "--modes",
        default=None,
        help="compare only these, comma-separated: draft, ngram, auto, reference "
        "(llama-cpp-python's decoders); plain always runs (default: all)",
    )
    bench.add_argument("--max-tokens", type=int, default=128, help="tokens per generation")
    bench.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample at this temperature (top_p 0.95) instead of greedy: the loop's host "
        "cost per token is larger there",
    )
    bench.add_argument("--repeats", type=int, default=1, help="alternating repeats per prompt")
    bench.add_argument("--category", action="append", default=[], help="only these categories")
    bench.add_argument(
        "--engine",
        action="store_true",
        help="run the suite through the engine (draftpen serve; started if none runs), as "
        "its clients see it, instead of loading the pair here; forward costs and "
        "llama-cpp-python's decoders are measured in-process only",
    )
    bench.add_argument(
        "--workers",
        default=None,
        metavar="HOST:PORT,...",
        help="split the target over these `draftpen worker`s (in-process runs only)",
    )
    bench.add_argument(
        "--worker-split",
        default=None,
        metavar="W,W,...",
        help="the layers' shares: this machine's, then each worker's (default: by free memory)",
    )
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.add_argument("--output", default=None, help="also write the JSON results to this file")
    bench.set_defaults(func=run_benchmark)
