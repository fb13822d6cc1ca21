"""A forward's logits kept on the MLX device, and the loop's questions answered there.

Where MLX computes on a GPU, copying a whole 150k-wide row back for each question the
loop asks (an argmax, a filtered distribution, a confidence) costs more than asking
MLX; ``MlxModel.forward_rows`` hands these rows out instead of host rows.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from backends.sampling.filters import SamplingParams, distribution
from backends.sampling.sparse_distribution import SparseDistribution
from backends.sampling.top_logits import distribution_from_top

# How many of a row's largest logits come back from the device for sampling: enough for
# top-k 40 and for the nuclei of an LLM's rows (a few tokens, sometimes tens).
DEVICE_CANDIDATES = 64
MAX_DEVICE_CANDIDATES = 1024  # a larger top-k filters the whole row on the host


class MlxRows:
    """A forward's logits kept as an MLX array; the loop's questions answered by MLX.

    Each kind of answer is computed for every row at once, in one evaluation, the
    first time a row is asked (a verify batch needs most of its rows): argmaxes; for
    sampling, each row's ``DEVICE_CANDIDATES`` largest logits and its log-sum-exp at
    the temperature, from which :func:`backends.sampling.top_logits.distribution_from_top`
    filters on the host; log-sum-exps at temperature 1 for confidences. Where the
    candidates cannot settle a distribution, that row is copied back and filtered
    whole, as on the host.
    """

    def __init__(self, logits: Any) -> None:
        self._logits = logits
        self._argmax: np.ndarray | None = None
        self._log_mass_at_1: np.ndarray | None = None
        self._top: dict[tuple[float, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        """How many rows."""
        return int(self._logits.shape[0])

    def row(self, index: int) -> np.ndarray:
        """The whole row, copied to the host once."""
        row = self._rows.get(index)
        if row is None:
            row = np.array(self._logits[index])
            self._rows[index] = row
        return row

    def greedy(self, index: int) -> int:
        """The row's argmax (every row's, computed together)."""
        if self._argmax is None:
            self._argmax = np.array(mx.argmax(self._logits, axis=-1))
        return int(self._argmax[index])

    def distribution(self, index: int, params: SamplingParams) -> SparseDistribution:
        """The row's filtered distribution from its top candidates (else the whole row)."""
        if params.greedy:
            return SparseDistribution.point(self.greedy(index))
        wanted = DEVICE_CANDIDATES
        if 0 < params.top_k <= MAX_DEVICE_CANDIDATES:
            wanted = max(wanted, params.top_k)
        ids, values, log_mass = self._candidates(params.temperature, wanted)
        n_vocab = int(self._logits.shape[1])
        found = distribution_from_top(
            ids[index], values[index], float(log_mass[index]), n_vocab, params
        )
        if found is not None:
            return found
        return distribution(self.row(index), params)

    def top_probability(self, index: int, token: int) -> float:
        """Softmax probability of ``token`` at temperature 1, from a device log-sum-exp."""
        if self._log_mass_at_1 is None:
            self._log_mass_at_1 = np.array(mx.logsumexp(self._logits, axis=-1))
        value = float(self._logits[index, token].item())
        return float(np.exp(value - float(self._log_mass_at_1[index])))

    def _candidates(
        self, temperature: float, wanted: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        found = self._top.get((temperature, wanted))
        if found is None:
            logits = self._logits
            wanted = min(wanted, int(logits.shape[1]))
            ids = mx.argpartition(-logits, kth=wanted - 1, axis=-1)[:, :wanted]
            values = mx.take_along_axis(logits, ids, axis=-1)
            log_mass = mx.logsumexp(logits * (1.0 / temperature), axis=-1)
            mx.eval(ids, values, log_mass)
            found = (np.array(ids).astype(np.int64), np.array(values), np.array(log_mass))
            self._top[(temperature, wanted)] = found
        return found
