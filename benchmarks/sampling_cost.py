"""Time ``sampling.distribution`` per vocabulary row (a benchmark, not a test).

Runs against whichever ``backends`` package is first on the path, so the same script
times the code before and after a change:

    PYTHONPATH=/path/to/old/tree python benchmarks/sampling_cost.py
    PYTHONPATH=. python benchmarks/sampling_cost.py

Rows look like a real LLM's over a 151,936-token vocabulary: a broad normal tail and
a few tokens well above it, so nucleus sizes range from a few tokens to hundreds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from backends.sampling.filters import SamplingParams, distribution, greedy_token

N_VOCAB = 151_936

SETTINGS = {
    "top_p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
    "none": SamplingParams(temperature=0.7),
    "min_p 0.05": SamplingParams(temperature=0.7, min_p=0.05),
    "top_k 40": SamplingParams(temperature=0.7, top_k=40),
    "top_p 0.95 (OpenAI)": SamplingParams(temperature=0.7, top_p=0.95),
    "chat default": SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
}


def realistic_rows(count: int, seed: int = 0) -> list[np.ndarray]:
    """Rows with a normal tail and a handful of favoured tokens of varied height."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        row = rng.standard_normal(N_VOCAB).astype(np.float32) * 2.0
        favoured = rng.choice(N_VOCAB, size=8, replace=False)
        row[favoured] += rng.uniform(6.0, 16.0, size=8).astype(np.float32)
        rows.append(row)
    return rows


def time_per_row(rows: list[np.ndarray], params: SamplingParams, repeats: int) -> float:
    """Best-of-``repeats`` mean seconds per row."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for row in rows:
            distribution(row, params)
        best = min(best, (time.perf_counter() - started) / len(rows))
    return best


def main() -> None:
    """Print milliseconds per row for each filter setting."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = realistic_rows(args.rows)
    for name, params in SETTINGS.items():
        print(f"{name:22s} {time_per_row(rows, params, args.repeats) * 1e3:7.3f} ms/row")
    started = time.perf_counter()
    for row in rows:
        greedy_token(row)
    print(f"{'greedy argmax':22s} {(time.perf_counter() - started) / len(rows) * 1e3:7.3f} ms/row")


if __name__ == "__main__":
    main()
