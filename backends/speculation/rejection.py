"""Speculative sampling's step for one drafted token: accept it, or draw its replacement.

A draft token x is accepted with probability ``min(1, p(x) / q(x))``; a rejected one
is replaced by a draw from the residual ``normalize(max(p - q, 0))``, so the token
emitted at that position is distributed exactly as the target's ``p``.
"""

from __future__ import annotations

import math

import numpy as np

from backends.sampling.sparse_distribution import PYTHON_CANDIDATES, SparseDistribution


def residual(target: SparseDistribution, draft: SparseDistribution) -> SparseDistribution:
    """normalize(max(p - q, 0)): where to sample after a draft token is rejected."""
    if target.ids.size + draft.ids.size <= PYTHON_CANDIDATES:
        return _small_residual(target, draft)
    # Only tokens p can emit have any excess (where p is 0, so is max(p - q, 0)): the
    # residual lives on p's support, and q is only looked up there.
    excess = target.probs - draft.probs_at(target.ids)
    np.maximum(excess, 0.0, out=excess)
    total = excess.sum()
    if total <= 0.0:
        # p == q: a rejection has probability zero, so any choice is fine; use p.
        return target
    keep = excess > 0.0
    return SparseDistribution(target.ids[keep], excess[keep] / total)


def _small_residual(target: SparseDistribution, draft: SparseDistribution) -> SparseDistribution:
    """:func:`residual` of two small supports, in Python: the same differences, summed
    exactly, with three numpy calls rather than twenty (cold after a forward)."""
    p = dict(zip(target.ids.tolist(), target.probs.tolist(), strict=True))
    q = dict(zip(draft.ids.tolist(), draft.probs.tolist(), strict=True))
    ids = sorted(p.keys() | q.keys())
    excess = [max(p.get(token, 0.0) - q.get(token, 0.0), 0.0) for token in ids]
    total = math.fsum(excess)
    if total <= 0.0:
        return target  # p == q: a rejection has probability zero; use p
    kept = [index for index, weight in enumerate(excess) if weight > 0.0]
    return SparseDistribution(
        np.array([ids[index] for index in kept], dtype=np.int64),
        np.array([excess[index] / total for index in kept]),
    )


def verify_draft_token(
    target: SparseDistribution,
    draft: SparseDistribution,
    draft_token: int,
    rng: np.random.Generator,
) -> int | None:
    """The speculative-sampling step for one drafted position.

    Accept ``draft_token`` with probability ``min(1, p(x) / q(x))`` and return None;
    otherwise return a replacement drawn from ``normalize(max(p - q, 0))``. The token
    emitted at this position is then distributed exactly as ``p``.
    """
    p_x = target.prob_of(draft_token)
    q_x = draft.prob_of(draft_token)
    if q_x > 0.0 and rng.random() * q_x < p_x:
        return None
    return residual(target, draft).sample(rng)
