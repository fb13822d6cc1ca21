"""Drafting during the remote verify, in THE loop: plain, the draft model at K=2 without
and with the overlap, and ``auto`` without and with it, on a target split over workers.

Issue 38, part 6. A prototype beside the loop measured first (``benchmarks/ssd_overlap.py``,
removed once the loop had it: in git history at b1d8dda);
this measures the loop itself (``backends/speculation/overlap.py``), through
``Engine.generate`` as ``draftpen bench`` and ``serve`` run it, with each mode's
``overlap_drafting`` set per request. One process; the modes alternate per prompt (the
order rotating), every prompt greedy. It reports tok/s and the ratios, how often the
guess held (pre-drafts used over rounds pre-drafted), and whether the modes wrote the
same tokens (the overlap against the same mode without it, and all against plain).

    PYTHONPATH=. python benchmarks/ssd_in_loop.py --target T.gguf --draft D.gguf \\
        --rtt-ms 0,2 --pin --json benchmarks/results/DATE-ssd-in-loop.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from backends.engine import Engine, GenerationRequest
from backends.llamacpp.model import LlamaCppModel
from backends.speculation.acceptance import AcceptanceEstimate, ConfidenceFloor
from backends.speculation.calibration import measure_costs
from backends.workers.cluster import Workers
from benchmarks.latency_proxy import LatencyProxy
from benchmarks.split_target import start_worker, stop_workers, write_result

PROMPTS = [
    "<|im_start|>user\nWrite a Python function that merges two sorted lists.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nExplain what a hash map is in three sentences.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a JSON object describing a book with title, author, year and "
    "tags.<|im_end|>\n<|im_start|>assistant\n",
]

# label -> (drafter, K, overlap)
MODES: dict[str, tuple[str, int, bool]] = {
    "plain": ("none", 0, False),
    "draft K=2": ("model", 2, False),
    "draft K=2 + overlap": ("model", 2, True),
    "auto": ("auto", 4, False),
    "auto + overlap": ("auto", 4, True),
}
COUNTED = ("generated_tokens", "decode_seconds", "rounds", "predrafted_rounds", "predrafts_used")


def run_setting(engine: Engine, args: argparse.Namespace) -> dict[str, Any]:
    """Every mode on every prompt, alternating; totals, ratios and output checks."""
    totals = {label: dict.fromkeys(COUNTED, 0.0) for label in MODES}
    memories = {label: ({}, ConfidenceFloor()) for label in MODES}  # auto learns apart
    outputs: dict[str, list[list[int]]] = {label: [] for label in MODES}
    labels = list(MODES)
    for index, text in enumerate(PROMPTS * args.repeats):
        prompt = tuple(engine.target.tokenize(text, add_special=False))
        order = labels[index % len(labels) :] + labels[: index % len(labels)]
        for label in order:
            drafter, k, overlap = MODES[label]
            memory: dict[str, AcceptanceEstimate] = memories[label][0]
            engine.use_acceptance_memory(memory, memories[label][1])
            request = GenerationRequest(
                prompt,
                max_tokens=args.max_tokens,
                drafter=drafter,
                draft_tokens=k,
                overlap_drafting=overlap,
            )
            tokens: list[int] = []
            last = None
            for event in engine.generate(request):
                tokens.extend(event.tokens)
                last = event
            assert last is not None
            for key in COUNTED:
                totals[label][key] += getattr(last.stats, key)
            outputs[label].append(tokens)
    rates = {label: t["generated_tokens"] / t["decode_seconds"] for label, t in totals.items()}
    return {
        "tok_s": {label: round(rate, 2) for label, rate in rates.items()},
        "ratio_to_plain": {label: round(rate / rates["plain"], 3) for label, rate in rates.items()},
        "overlap_over_without": {
            "draft K=2": round(rates["draft K=2 + overlap"] / rates["draft K=2"], 3),
            "auto": round(rates["auto + overlap"] / rates["auto"], 3),
        },
        "guess_held": {
            label: f"{int(t['predrafts_used'])} of {int(t['predrafted_rounds'])} pre-drafted "
            f"rounds ({int(t['rounds'])} rounds)"
            for label, t in totals.items()
            if t["predrafted_rounds"]
        },
        "overlap_wrote_the_same_tokens": {
            "draft K=2": outputs["draft K=2"] == outputs["draft K=2 + overlap"],
            "auto": outputs["auto"] == outputs["auto + overlap"],
        },
        "all_wrote_plains_tokens": all(tokens == outputs["plain"] for tokens in outputs.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target GGUF")
    parser.add_argument("--draft", required=True, help="the draft GGUF")
    parser.add_argument("--rtt-ms", default="0,2")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--worker-split", default="0,1,1")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="workers on CPU 1, this process on CPU 0 with one llama.cpp thread: this "
        "machine's CPU then idles during a verify as it does when workers are elsewhere",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ssd-in-loop-"))
    prefix = ("taskset", "-c", "1") if args.pin else ()
    workers = [start_worker(home, 1, prefix) for _ in range(2)]
    threads = None
    if args.pin:
        os.sched_setaffinity(0, {0})
        threads = 1
    load_1 = os.getloadavg()[0]
    started = time.monotonic()
    draft = LlamaCppModel(args.draft, n_ctx=2048, n_threads=threads)
    rows = []
    try:
        for rtt in [float(value) for value in args.rtt_ms.split(",")]:
            proxies = [LatencyProxy(("127.0.0.1", port), rtt / 2000) for _, port in workers]
            addresses = ",".join(proxy.address for proxy in proxies)
            chosen = Workers.parse(addresses, args.worker_split)
            target = LlamaCppModel(
                args.target,
                n_ctx=2048,
                n_threads=threads,
                workers=chosen.ask(),
                worker_split=chosen.weights,
            )
            engine = Engine(target, draft)
            engine.costs = measure_costs(target, draft, sizes=(1, 2, 3, 4, 5, 8), repeats=2)
            row = {
                "rtt_ms": rtt,
                "placement": target.placement,
                "overlaps": engine.overlaps(),
                **run_setting(engine, args),
            }
            rows.append(row)
            print(row, file=sys.stderr)
            target.close()
            for proxy in proxies:
                proxy.close()
    finally:
        stop_workers(workers)
    result = {
        "pinned": args.pin,
        "worker_split": args.worker_split,
        "max_tokens": args.max_tokens,
        "prompts": len(PROMPTS) * args.repeats,
        "load_average_1min_at_start": round(load_1, 2),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "seconds": round(time.monotonic() - started, 1),
        "rows": rows,
    }
    write_result(result, args.json)


if __name__ == "__main__":
    main()
