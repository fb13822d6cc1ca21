"""What presence/frequency penalties cost the loop per row, on a real vocabulary's size.

    PYTHONPATH=. python benchmarks/penalty_cost.py [--vocab N] [--seen 50,200] [--repeats N]

Times ``TokenCounts.apply`` (a copy of the row, then the seen tokens lowered) and a
whole greedy choice (penalise, argmax) and a sampled one (penalise, top-p 0.95 at
temperature 0.7) against the same without penalties, on random float32 rows. Prints
microseconds per row, the median of the repeats. On a shared machine take the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from backends.sampling.filters import SamplingParams, distribution, greedy_token
from backends.sampling.penalties import TokenCounts


def per_row_us(function, rows: np.ndarray, repeats: int) -> float:
    times = []
    for index in range(repeats):
        row = rows[index % rows.shape[0]]
        started = time.perf_counter()
        function(row)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--seen", default="50,200,1000")
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((16, args.vocab)) * 3).astype(np.float32)
    sampled = SamplingParams(temperature=0.7, top_p=0.95)
    print(f"vocabulary {args.vocab}, median of {args.repeats} rows (microseconds per row)")
    base_greedy = per_row_us(greedy_token, rows, args.repeats)
    base_sampled = per_row_us(lambda row: distribution(row, sampled), rows, args.repeats)
    print(f"  no penalties: greedy {base_greedy:8.1f}   sampled {base_sampled:8.1f}")
    for seen in (int(part) for part in args.seen.split(",")):
        counts = TokenCounts(presence=0.5, frequency=0.5)
        counts.add(rng.integers(0, args.vocab, size=seen).tolist())
        apply = per_row_us(counts.apply, rows, args.repeats)
        greedy = per_row_us(
            lambda row, counts=counts: greedy_token(counts.apply(row)), rows, args.repeats
        )
        sampled_us = per_row_us(
            lambda row, counts=counts: distribution(counts.apply(row), sampled),
            rows,
            args.repeats,
        )
        print(
            f"  {seen:5} tokens seen: apply {apply:7.1f}   greedy {greedy:8.1f}"
            f"   sampled {sampled_us:8.1f}"
        )


if __name__ == "__main__":
    main()
