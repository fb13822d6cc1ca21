"""The kept set of a filtered row: the top-p nucleus among candidates, then min-p.

:func:`nucleus_in` finds the smallest top set whose mass reaches ``top_p`` when it
lies among the candidates and the mass outside them is known well enough (else it
says why not); :func:`finish` applies min-p to what is kept and normalises it.
"""

from __future__ import annotations

import numpy as np

from backends.sampling.sparse_distribution import SparseDistribution

# Up to this many candidates the nucleus is found by a stable argsort; up to
# _SORT_LIMIT by sorting the weights' values (several times faster than a stable
# argsort from a few hundred on); larger sets are grouped by magnitude first (see
# _smallest_top_set).
_ARGSORT_LIMIT = 256
_SORT_LIMIT = 32_768
_LEVELS_PER_NAT = 4.0
_LAST_LEVEL = 4096
_TINY = 1e-300


class Verdict:
    """Why :func:`nucleus_in` could not return the nucleus."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


BEYOND = Verdict("BEYOND")  # the nucleus surely reaches past the candidates
UNDECIDED = Verdict("UNDECIDED")  # it depends on the mass outside, not known well enough


def nucleus_in(
    ids: np.ndarray, weights: np.ndarray, top_p: float, outside: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray] | Verdict:
    """The smallest top set whose mass reaches ``top_p``, if it lies within ``ids``.

    ``weights`` are the candidates' unnormalised probabilities; the rest of the row
    weighs between ``outside[0]`` and ``outside[1]`` on the same scale. The nucleus
    is returned only when every total in that range gives the same one.
    """
    inside = float(weights.sum())
    low, high = top_p * (inside + outside[0]), top_p * (inside + outside[1])
    if inside < high:
        return BEYOND if inside < low else UNDECIDED
    size = weights.size
    if size <= _SORT_LIMIT:
        # One sort serves both goals.
        if size <= _ARGSORT_LIMIT:
            order = np.argsort(-weights, kind="stable")
            descending = weights[order]
        else:
            order = None
            descending = np.sort(weights)[::-1]
        cumulative = np.cumsum(descending)
        count = min(int(np.searchsorted(cumulative, high)) + 1, size)
        if high != low and min(int(np.searchsorted(cumulative, low)) + 1, size) != count:
            return UNDECIDED
        if count == size:
            return ids, weights
        kept = order[:count] if order is not None else _first_largest(weights, descending, count)
        return ids[kept], weights[kept]
    kept = _smallest_top_set(weights, high)
    if high != low and _smallest_top_set(weights, low).size != kept.size:
        return UNDECIDED
    return ids[kept], weights[kept]


def _first_largest(weights: np.ndarray, descending: np.ndarray, count: int) -> np.ndarray:
    """Positions of the ``count`` largest ``weights`` (``descending``: them sorted), equal
    weights at the boundary taken in position order: the first ``count`` of a stable
    argsort of ``-weights``, without one.

    Every weight above the ``count``-th largest is kept; of those equal to it, the
    first few by position fill the rest (a stable sort puts them in that order). The
    positions come out ascending, so ascending ids stay sorted for :func:`finish`.
    """
    boundary = descending[count - 1]
    keep = weights > boundary
    tied = np.flatnonzero(weights == boundary)
    keep[tied[: count - int(np.count_nonzero(keep))]] = True
    return np.flatnonzero(keep)


def _smallest_top_set(weights: np.ndarray, goal: float) -> np.ndarray:
    """Indices of the fewest largest ``weights`` whose sum reaches ``goal``.

    For more than ``_SORT_LIMIT`` weights: they are first grouped by magnitude
    (buckets a quarter of a nat wide, by one ``bincount``), so only the bucket where
    the running sum crosses ``goal`` needs sorting.
    """
    # weights are exp(x - max) in (0, 1]: larger weight, lower level; ties share one.
    levels = -np.log(np.maximum(weights, _TINY)) * _LEVELS_PER_NAT
    levels = np.minimum(levels, _LAST_LEVEL).astype(np.int64)
    cumulative = np.cumsum(np.bincount(levels, weights=weights))
    crossing = min(int(np.searchsorted(cumulative, goal)), cumulative.size - 1)
    before = float(cumulative[crossing - 1]) if crossing else 0.0
    above = np.flatnonzero(levels < crossing)
    at = np.flatnonzero(levels == crossing)
    at = at[np.argsort(-weights[at], kind="stable")]
    count = int(np.searchsorted(before + np.cumsum(weights[at]), goal)) + 1
    return np.concatenate((above, at[: min(count, at.size)]))


def finish(ids: np.ndarray, weights: np.ndarray, min_p: float) -> SparseDistribution:
    """Apply min-p to a truncated set, sort ids, normalise."""
    if min_p > 0.0:
        keep = weights >= min_p * weights.max()
        ids, weights = ids[keep], weights[keep]
    order = np.argsort(ids)
    ids = ids[order].astype(np.int64, copy=False)
    weights = weights[order]
    return SparseDistribution(ids, weights / weights.sum())
