"""What a CPU decode does to the loop's own work: the same host work, timed right after
a llama.cpp decode and again a moment later (a benchmark, not a test).

On a CPU, ``llama_decode`` streams the target's weights (about 1 GB for the starter
target) through the caches, and the Python interpreter's and numpy's code and data
are evicted with everything else. The loop's work between two decodes then runs
from memory, several times slower than the same work a moment later. This is why the
host time per token that ``generate --json`` reports on a CPU is higher than what the
same loop costs beside a runtime that leaves the CPU's caches alone (a GPU's, or
Apple Silicon's GPU), which ``benchmarks/simulated_runtime.py`` models.

Each round decodes one token of the target (a greedy continuation of a code prompt,
so every row is a new position's), copies the row the loop would sample (so the row
itself is in the cache either way), then times the work twice:
"after a decode" and "again". The work is what one plain round does with a row:
``greedy_token`` at temperature 0, ``distribution`` plus a sample at 0.7.

A second table needs no model: a row-sized array is written, the thread then waits
(spinning in Python, touching almost nothing) for a while, and one ``max`` over the
array is timed. On a machine whose caches survive a wait, the time stays flat; where
it climbs with the wait, something else (the hypervisor, other tenants, the
scheduler moving the thread) takes the caches while the loop waits for its runtime,
as it does on every step; such a machine's host figures overstate what the same loop
costs elsewhere.

    DRAFTPEN_MODELS_DIR=... python benchmarks/cache_eviction.py --pair starter
    python benchmarks/cache_eviction.py --waits-only
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from app.models.pair_files import pair_files
from backends.llamacpp.model import LlamaCppModel
from backends.sampling.filters import SamplingParams, distribution, greedy_token

PROMPT = "Write a Python function that reverses a list, and explain how it works."
SETTINGS: dict[str, SamplingParams] = {
    "T0 argmax": SamplingParams(temperature=0.0),
    "T0.7 top_p .95": SamplingParams(temperature=0.7, top_p=0.95),
    "chat defaults": SamplingParams(temperature=0.7, top_p=0.95, top_k=40, min_p=0.05),
}
WAITS_MS = (0.0, 0.1, 0.3, 1.0, 2.0, 4.0, 8.0, 16.0)  # the waits table's waits


def row_work(params: SamplingParams, rng: np.random.Generator) -> Callable[[np.ndarray], None]:
    """What one plain round does with its row under ``params``."""

    def greedy(row: np.ndarray) -> None:
        greedy_token(row)

    def sampled(row: np.ndarray) -> None:
        distribution(row, params).sample(rng)

    return greedy if params.greedy else sampled


def print_waits(n_vocab: int, rounds: int) -> None:
    """Median microseconds of one ``max`` over a row written just before a wait."""
    source = (np.random.default_rng(0).standard_normal(n_vocab) * 2.5).astype(np.float32)
    row = np.empty_like(source)
    print(f"a {n_vocab}-float row written, then a wait, then one max over it ({rounds} each)")
    for wait_ms in WAITS_MS:
        times: list[float] = []
        for _ in range(rounds):
            np.copyto(row, source)
            deadline = time.perf_counter() + wait_ms / 1e3
            while time.perf_counter() < deadline:
                pass
            started = time.perf_counter()
            row.max()
            times.append(time.perf_counter() - started)
        print(f"  wait {wait_ms:5.1f} ms: max {statistics.median(times) * 1e6:7.1f} us")


def main() -> None:
    """Print median microseconds per row: after a decode, again, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--rounds", type=int, default=96, help="decodes per setting")
    parser.add_argument("--waits-only", action="store_true", help="only the waits table")
    args = parser.parse_args()
    print_waits(151_936, args.rounds)
    if args.waits_only:
        return

    model = LlamaCppModel(pair_files(args.pair, "llamacpp").target_path, n_ctx=2048)
    try:
        prompt = model.tokenize(PROMPT)
        model.prefill(prompt[:-1])
        kept = len(model.cached_tokens)
        rng = np.random.default_rng(1)
        print(
            f"{args.pair} target, {model.n_vocab}-token rows, {args.rounds} decodes each, "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        print(f"{'work':<16} {'after a decode':>15} {'again':>8} {'ratio':>6}")
        for name, params in SETTINGS.items():
            work = row_work(params, rng)
            after: list[float] = []
            again: list[float] = []
            model.rollback(kept)
            token = prompt[-1]
            for _ in range(args.rounds):
                row = model.forward([token])[0].copy()
                started = time.perf_counter()
                work(row)
                middle = time.perf_counter()
                work(row)
                after.append(middle - started)
                again.append(time.perf_counter() - middle)
                token = greedy_token(row)  # a greedy continuation: a new row each round
            cold, warm = statistics.median(after), statistics.median(again)
            print(f"{name:<16} {cold * 1e6:12.1f} us {warm * 1e6:5.1f} us {cold / warm:5.1f}x")
    finally:
        model.close()


if __name__ == "__main__":
    main()
