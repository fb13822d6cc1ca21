"""The bound the distribution tests of drafters' ``q`` hold their samples to.

A drafter's draws must follow the ``q`` it reports, and the loop's accept/resample step
must then emit tokens that follow the target's ``p``; both are checked by the total
variation distance between the empirical distribution of the samples and the true one
(tests/speculation/test_sampling_lossless.py derives the bound).
"""

from __future__ import annotations

import math

from backends.sampling.sparse_distribution import SparseDistribution

FAILURE_PROBABILITY = 1e-6


def tv_bound(n: int, support: int) -> float:
    """TV(empirical, true) stays below this except with probability 1e-6."""
    return 0.5 * math.sqrt(support / n) + math.sqrt(math.log(1 / FAILURE_PROBABILITY) / (2 * n))


def empirical_tv(tokens: list[int], expected: SparseDistribution) -> float:
    """The total variation distance between ``tokens``' frequencies and ``expected``."""
    counts: dict[int, int] = {}
    for token in tokens:
        counts[token] = counts.get(token, 0) + 1
    ids = set(counts) | {int(token) for token in expected.ids}
    return 0.5 * sum(abs(counts.get(i, 0) / len(tokens) - expected.prob_of(i)) for i in ids)
