"""The filters for a row known only by its top logits (a runtime that filters on its device)."""

from __future__ import annotations

import math

import numpy as np

from backends.sampling.filters import SamplingParams
from backends.sampling.nucleus import finish, nucleus_in
from backends.sampling.sparse_distribution import SparseDistribution

# distribution_from_top trusts a device's float32 log-sum-exp of a row to this share
# of the row's mass: MLX's (CPU build) was off by up to 2.2e-4 on 151,936-token rows
# against float64 (its float32 exponential), so ten times that.
_DEVICE_MASS_SLACK = 2e-3


def distribution_from_top(
    ids: np.ndarray,
    values: np.ndarray,
    log_mass: float,
    n_vocab: int,
    params: SamplingParams,
) -> SparseDistribution | None:
    """The filtered distribution of a row known only by its top tokens, or None.

    For a runtime that filters on its device: ``ids`` and ``values`` are the row's M
    largest logits (any order; no token outside beats one inside), ``log_mass`` is
    ``log(sum(exp(x / T)))`` over the whole row in float32. The filters then run in
    float64 on the candidates exactly as :func:`backends.sampling.filters.distribution` runs
    them: top-k within them, top-p with the rest of the row's mass known to
    ``_DEVICE_MASS_SLACK`` of the whole (a float32 sum of 150k exponentials) and
    decided only where that error cannot move the nucleus, min-p where its cut falls
    inside them. None where the candidates cannot settle it (top-k beyond M, a nucleus
    or a min-p set reaching past them, no filter at all): the caller then filters the
    whole row on the host. Plain and speculative decoding on such a runtime both call
    this, so they still sample one distribution.
    """
    temperature = params.temperature
    top_k = params.top_k if 0 < params.top_k < n_vocab else 0
    top_p, min_p = params.top_p, params.min_p
    count = ids.size
    if params.greedy or count == 0 or (not top_k and top_p >= 1.0 and min_p == 0.0):
        return None
    if top_k:
        if top_k > count:
            return None
        if top_k < count:
            keep = np.argpartition(values, count - top_k)[count - top_k :]
            ids, values = ids[keep], values[keep]
    top = float(values.max())
    if not math.isfinite(top):
        return None
    top_scaled = top / temperature
    weights = np.exp(values.astype(np.float64) / temperature - top_scaled)
    if top_p < 1.0:
        if top_k:
            outside = (0.0, 0.0)  # the top-k set is all there is
        else:
            total = math.exp(log_mass - top_scaled)
            rest = max(total - float(weights.sum()), 0.0)
            slack = _DEVICE_MASS_SLACK * total
            outside = (max(rest - slack, 0.0), rest + slack)
        found = nucleus_in(ids, weights, top_p, outside)
        if not isinstance(found, tuple):
            return None
        ids, weights = found
    elif not top_k and float(weights.min()) >= min_p and count < n_vocab:
        return None  # min-p alone keeps tokens down to the last candidate, maybe beyond
    return finish(ids, weights, min_p)
