"""A probability distribution over a few token ids: lookups and draws.

Every filter, drafter and the rejection step speak :class:`SparseDistribution`: the ids
that survived filtering, sorted, with their probabilities. With the usual filters that
is tens of tokens, not the whole vocabulary, so sampling and lookups cost little.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SparseDistribution:
    """A probability distribution over a few token ids (sorted ascending)."""

    ids: np.ndarray
    probs: np.ndarray

    @staticmethod
    def point(token: int) -> SparseDistribution:
        """All mass on one token (what an n-gram or prediction drafter proposes)."""
        return SparseDistribution(np.array([token], dtype=np.int64), _ALL_MASS)

    def prob_of(self, token: int) -> float:
        """Probability of one token (0 outside the support)."""
        index = int(np.searchsorted(self.ids, token))
        if index < self.ids.size and self.ids[index] == token:
            return float(self.probs[index])
        return 0.0

    def probs_at(self, tokens: np.ndarray) -> np.ndarray:
        """Probabilities of sorted ``tokens`` (0 outside the support)."""
        index = np.searchsorted(self.ids, tokens)
        index_clipped = np.minimum(index, self.ids.size - 1)
        hit = self.ids[index_clipped] == tokens
        return np.where(hit, self.probs[index_clipped], 0.0)

    def sample(self, rng: np.random.Generator) -> int:
        """Draw one token."""
        if self.ids.size == 1:
            return int(self.ids[0])
        return int(self.ids[_inverse_cdf(self.probs, rng.random())])

    @property
    def top_prob(self) -> float:
        """The largest probability in the distribution."""
        size = self.probs.size
        if size == 1:
            return float(self.probs[0])
        if size <= PYTHON_CANDIDATES:
            return max(self.probs.tolist())  # no numpy reduction (cold after a forward)
        return float(self.probs.max())


# The probabilities of every point distribution: one read-only array, shared.
_ALL_MASS = np.ones(1)
_ALL_MASS.setflags(write=False)


# Up to this many candidates near the top, the filters run in plain Python (see
# _near_top_in_python in backends/sampling/filters.py); more go through numpy. Distributions
# and residuals this small are summed in Python too (see backends/speculation/rejection.py).
PYTHON_CANDIDATES = 256
# Large distributions are sampled block by block (see _inverse_cdf).
_SAMPLE_BLOCK = 1024


def _inverse_cdf(probs: np.ndarray, u: float) -> int:
    """Index i with cumulative(i - 1) <= u * total < cumulative(i).

    A few hundred probabilities are summed and searched in Python (the same left to
    right sums as ``np.cumsum``, the same search as ``np.searchsorted``): a nucleus of
    a few tokens is then sampled with one numpy call, not three, each of which is cold
    right after a forward. Large distributions are walked block by block (block sums,
    then one block's cumulative sum) instead of one cumulative sum over the whole
    vocabulary.
    """
    size = probs.size
    if size <= PYTHON_CANDIDATES:
        running = list(itertools.accumulate(probs.tolist()))
        return min(bisect.bisect_right(running, u * running[-1]), size - 1)
    if size <= 4 * _SAMPLE_BLOCK:
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
        return min(index, size - 1)
    block_mass = np.cumsum(np.add.reduceat(probs, np.arange(0, size, _SAMPLE_BLOCK)))
    goal = u * block_mass[-1]
    block = min(int(np.searchsorted(block_mass, goal, side="right")), block_mass.size - 1)
    before = float(block_mass[block - 1]) if block else 0.0
    start = block * _SAMPLE_BLOCK
    inside = np.cumsum(probs[start : start + _SAMPLE_BLOCK])
    index = int(np.searchsorted(inside, goal - before, side="right"))
    return start + min(index, inside.size - 1)
