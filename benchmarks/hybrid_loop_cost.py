"""The loop's cost on tiny hybrid targets: host time, rollback, the MTP head (a benchmark).

Writes tiny random-weight ``qwen35`` GGUFs with tests/support/tiny_hybrid.py (Gated DeltaNet +
attention, SmolLM2's tokenizer): a target with its nextn (MTP) block, the same trunk
without it, and a draft model (that trunk with noise on its weights); and, for
comparison, an attention-only ``qwen3`` model of the same width, depth and vocabulary
with its own noisy draft. Then, in this one process:

1. **The loop**: each target generates with ``--drafter none / ngram / model / mtp`` at
   temperature 0 and at 0.7 (top_p 0.95), fixed K, and the statistics' host time per
   generated token (``host_ms_per_token``: decode time outside the runtimes' forward
   and rollback calls, the figure ``draftpen generate --json`` reports) is read from
   ``Engine.generate``'s statistics, with tok/s. The consumer here does nothing with
   the events; ``generate`` also prints the reply, which counts as host time there.
   The target's and the drafters' runtime calls are timed too (the timers run inside
   the runtime's share of the time, not the host's), which gives what a verify, a
   rollback, a draft-model step and an MTP step cost, and how many checkpoint restores
   and replayed tokens a run needed. One extra target is the hybrid without snapshots
   (``rollback_snapshots=0``): every verify then rolls back by checkpoint and replay.
2. **Rollback, one operation at a time**, on a prompt already read: a 5-token forward
   then dropping 3 of it, by llama.cpp's snapshots, by checkpoint restore (the copy
   before the forward timed apart) and by a KV-cache cut on the attention-only model;
   and the next 1-token forward, which after a restore first replays the kept tokens
   (ahead of the batch, or as a decode of their own where the batch needs a checkpoint
   before it, as every verify does without snapshots).

Random weights say nothing about acceptance, and so nothing about speed-ups: the tiny
models' acceptance figures are printed only to show what each run did. The host and
per-operation costs are this loop's and this runtime's own. Each figure is the median
(and the fastest) of the repeats, with the one-minute load average during them: the
machine may be shared. llama.cpp runs one thread by default: on a shared 2-core
machine two threads wait on each other behind whatever else runs (a tiny model's
decode took ~390 ms instead of ~1.4 ms here), and one thread is what a model this
small needs.

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        nice -n 10 python benchmarks/hybrid_loop_cost.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from backends.base import ChatMessage
from benchmarks.rollback_operations import MicroResult, micro_rollback
from benchmarks.timed_loop_runs import SETTINGS, LoopRun, Target, instrument, load_engine, run_loop
from benchmarks.tiny_hybrid_models import write_files

PROMPT = "Write a Python function that reverses a list, and explain how it works."


# -- reporting ------------------------------------------------------------------------------


def _cell(values: list[float], digits: int = 3) -> str:
    """Median (fastest) of ``values``; '-' when empty."""
    if not values:
        return "-"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f})"


def _median(values: list[float | None], digits: int = 3) -> str:
    present = [value for value in values if value is not None]
    return f"{statistics.median(present):.{digits}f}" if present else "-"


def machine_line(threads: int) -> str:
    import llama_cpp

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next(
                line.split(":", 1)[1].strip() for line in info if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return (
        f"{cpu}, {os.cpu_count()} CPUs; llama-cpp-python {llama_cpp.__version__}, "
        f"{threads} llama.cpp thread(s); draftpen {commit or '?'}"
    )


def report(
    runs: list[LoopRun], micro: list[MicroResult], args: argparse.Namespace
) -> Iterator[str]:
    """The text report."""
    yield "The loop's cost on tiny random-weight hybrid (qwen35) targets, CPU"
    yield machine_line(args.threads)
    yield (
        f"{args.max_tokens} tokens per run, K={args.draft_tokens}, {args.repeats} repeats; "
        "median (fastest); load = the one-minute load average during the runs"
    )
    yield (
        "RANDOM WEIGHTS: acceptance and tokens per pass say nothing about real models, and "
        "so neither do tok/s or speed-ups. The host and per-call costs are the loop's and "
        "the runtime's own, on models whose LM head (49,152 x 256) is most of a step."
    )
    yield ""
    yield (
        "1. Host time (outside the runtime calls) per generated token and per round (one "
        "target pass), and what the runs did; restores and replayed tokens are the target's "
        "(a run's first rollback, back to the prompt the run before it shared, included)"
    )
    header = (
        f"{'target':<26} {'drafter':<7} {'setting':<5} {'host ms/token':>15} "
        f"{'host ms/round':>15} {'tok/s':>6} {'accept':>6} {'tok/pass':>8} "
        f"{'restores':>8} {'replayed':>8} {'load':>9}"
    )
    yield header
    groups: dict[tuple[str, str, str], list[LoopRun]] = {}
    for run in runs:
        groups.setdefault((run.target, run.drafter, run.setting), []).append(run)
    for (target, drafter, setting), done in groups.items():
        loads = [run.load for run in done]
        yield (
            f"{target:<26} {drafter:<7} {setting:<5} "
            f"{_cell([run.host_ms_per_token for run in done]):>15} "
            f"{_cell([run.host_ms_per_round for run in done]):>15} "
            f"{statistics.median(run.tokens_per_second for run in done):6.0f} "
            f"{statistics.median(run.acceptance for run in done):6.2f} "
            f"{statistics.median(run.tokens_per_pass for run in done):8.2f} "
            f"{statistics.median(run.restores for run in done):8.0f} "
            f"{statistics.median(run.replayed_tokens for run in done):8.0f} "
            f"{min(loads):4.1f}-{max(loads):<4.1f}"
        )
    yield ""
    yield (
        "2. What the runtime calls cost inside those runs (ms; medians over the runs' calls, "
        "but rollbacks per generated token: the target's, and the draft model's)"
    )
    yield (
        f"{'target':<26} {'drafter':<7} {'setting':<5} {'1-tok fwd':>9} {'verify':>7} "
        f"{'(tokens)':>8} {'rollback/tok':>12} {'ckpt':>6} {'restore':>7} "
        f"{'draft step':>10} {'keep pt':>7} {'d rb/tok':>8} {'mtp start':>9} "
        f"{'mtp step':>8} {'mtp/drafted':>11}"
    )
    for (target, drafter, setting), done in groups.items():
        yield (
            f"{target:<26} {drafter:<7} {setting:<5} "
            f"{_median([run.single_forward_ms for run in done]):>9} "
            f"{_median([run.verify_ms for run in done]):>7} "
            f"{_median([run.verify_tokens for run in done], 0):>8} "
            f"{_median([run.rollback_ms_per_token for run in done], 4):>12} "
            f"{_median([run.checkpoint_ms for run in done]):>6} "
            f"{_median([run.restore_ms for run in done]):>7} "
            f"{_median([run.draft_step_ms for run in done]):>10} "
            f"{_median([run.draft_keep_point_ms for run in done]):>7} "
            f"{_median([run.draft_rollback_ms_per_token for run in done], 4):>8} "
            f"{_median([run.mtp_start_ms for run in done]):>9} "
            f"{_median([run.mtp_step_ms for run in done]):>8} "
            f"{_median([run.mtp_ms_per_drafted for run in done]):>11}"
        )
    mtp_runs = [run for run in runs if run.drafter == "mtp" and run.mtp_ms_per_drafted]
    plain = [
        run.single_forward_ms
        for run in runs
        if run.drafter == "none" and run.target == "hybrid + MTP" and run.single_forward_ms
    ]
    if mtp_runs and plain:
        per_drafted = statistics.median(run.mtp_ms_per_drafted or 0.0 for run in mtp_runs)
        step = statistics.median(run.mtp_step_ms or 0.0 for run in mtp_runs)
        verify = statistics.median(run.verify_ms or 0.0 for run in mtp_runs)
        one = statistics.median(plain)
        yield (
            f"MTP head: {per_drafted:.3f} ms per drafted token (its chained step alone "
            f"{step:.3f}) against a {verify:.3f} ms verify of {args.draft_tokens + 1} "
            f"tokens and a {one:.3f} ms one-token target step: a step costs "
            f"{step / one:.2f} of a target step here (the shared 49,152-row LM head is most "
            "of both)"
        )
    yield ""
    yield "3. Rollback, one operation at a time (ms; prompt read, then repeated)"
    yield f"{'model':<34} {'operation':<48} {'median':>8} {'fastest':>8} {'n':>4} {'load':>5}"
    for result in micro:
        yield (
            f"{result.model:<34} {result.operation:<48} {result.median_ms:8.3f} "
            f"{result.fastest_ms:8.3f} {result.samples:4d} {result.load:5.1f}"
            + (f"  {result.note}" if result.note else "")
        )


def main() -> None:
    """Write the models, run every cell, print the report (and save JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads per model")
    parser.add_argument("--micro-repeats", type=int, default=40)
    parser.add_argument("--json", type=Path, default=None, help="also write the runs here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tiny-hybrid-") as folder:
        started = time.perf_counter()
        files = write_files(Path(folder))
        print(f"# wrote the tiny models in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        targets = [
            Target("hybrid", files.hybrid, files.hybrid_draft, ("none", "ngram", "model")),
            Target(
                "hybrid + MTP",
                files.hybrid_mtp,
                files.hybrid_draft,
                ("none", "ngram", "model", "mtp"),
            ),
            Target(
                "hybrid, no snapshots",
                files.hybrid,
                files.hybrid_draft,
                ("ngram", "model"),
                snapshots=0,
            ),
            Target(
                "attention-only",
                files.attention,
                files.attention_draft,
                ("none", "ngram", "model"),
            ),
        ]
        runs: list[LoopRun] = []
        for target in targets:
            engine = load_engine(target, args.threads)
            try:
                timers = instrument(engine)
                prompt = engine.chat_prompt([ChatMessage("user", PROMPT)])
                for repeat in range(args.repeats):
                    for setting in SETTINGS:
                        # Rotate the drafters' order so none always runs first.
                        shift = repeat % len(target.drafters)
                        for drafter in target.drafters[shift:] + target.drafters[:shift]:
                            run = run_loop(engine, timers, target, drafter, setting, prompt, args)
                            runs.append(run)
                            print(
                                f"# {target.label}, {drafter}, {setting}: host "
                                f"{run.host_ms_per_token:.3f} ms/token, "
                                f"{run.tokens_per_second:.0f} tok/s, load {run.load:.2f}",
                                file=sys.stderr,
                                flush=True,
                            )
            finally:
                engine.close()
        micro: list[MicroResult] = []
        for label, path, snapshots in (
            ("attention-only", files.attention, None),
            ("hybrid, snapshots (16)", files.hybrid, None),
            ("hybrid, no snapshots", files.hybrid, 0),
        ):
            micro.extend(micro_rollback(label, path, snapshots, args.threads, args.micro_repeats))
    for line in report(runs, micro, args):
        print(line)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine_line(args.threads),
                    "max_tokens": args.max_tokens,
                    "repeats": args.repeats,
                    "draft_tokens": args.draft_tokens,
                    "runs": [asdict(run) for run in runs],
                    "rollback_operations": [asdict(result) for result in micro],
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
