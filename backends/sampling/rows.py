"""A forward pass's logits as the loop reads them: argmaxes, distributions, whole rows.

The speculative loop and the draft model ask of each row only what their step needs:
the argmax to verify a greedy draft, the filtered distribution to sample or to judge a
sampled one, the drafter's confidence in its own token, and the whole row only where
the reply's penalties, a grammar's mask or logprobs need it. :class:`HostRows` answers
from logits on the host (llama.cpp's buffer, or any ``Model.forward``). A runtime that
computes on a device can do better: ``forward_rows`` (an optional method of a model)
returns rows that answer there and bring back only ids and probabilities (the MLX
runtime's, ``backends/mlx/model.py``). :func:`forward_rows` picks whichever the
model offers, so the loop is written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from backends.base import Model
from backends.sampling.filters import SamplingParams, distribution, greedy_token
from backends.sampling.row_scans import top_token_probability
from backends.sampling.sparse_distribution import SparseDistribution


class LogitRows(Protocol):
    """The logits of one forward, one row per evaluated position, valid until the next
    forward of the same model (like the arrays ``Model.forward`` returns)."""

    def __len__(self) -> int:
        """How many rows."""
        ...

    def row(self, index: int) -> np.ndarray:
        """The whole row on the host (float32, the vocabulary's width)."""
        ...

    def greedy(self, index: int) -> int:
        """The row's argmax (the first of tied maxima)."""
        ...

    def distribution(self, index: int, params: SamplingParams) -> SparseDistribution:
        """The row filtered as :func:`backends.sampling.filters.distribution` filters it."""
        ...

    def top_probability(self, index: int, token: int) -> float:
        """Softmax probability (temperature 1) of ``token``, the row's argmax."""
        ...


class HostRows:
    """Rows of logits that are on the host already: numpy does the work."""

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits

    def __len__(self) -> int:
        """How many rows."""
        return int(self.logits.shape[0])

    def row(self, index: int) -> np.ndarray:
        """The row itself (a view)."""
        return self.logits[index]

    def greedy(self, index: int) -> int:
        """The row's argmax."""
        return greedy_token(self.logits[index])

    def distribution(self, index: int, params: SamplingParams) -> SparseDistribution:
        """The row's filtered distribution."""
        return distribution(self.logits[index], params)

    def top_probability(self, index: int, token: int) -> float:
        """The argmax's softmax probability, to within 0.1%."""
        return top_token_probability(self.logits[index], token)


class ForwardsRows(Protocol):
    """A model whose forward can hand back :class:`LogitRows` (an optional capability)."""

    def forward_rows(self, tokens: Sequence[int], *, last_only: bool = False) -> LogitRows:
        """Like ``Model.forward``, with the logits left where the runtime computed them."""
        ...


def forward_rows(model: Model, tokens: Sequence[int], *, last_only: bool = False) -> LogitRows:
    """Evaluate ``tokens`` in one forward; the logits as rows the loop can ask questions.

    A model with ``forward_rows`` answers on its own device; any other is wrapped in
    :class:`HostRows`.
    """
    on_device = getattr(model, "forward_rows", None)
    if on_device is not None:
        rows: LogitRows = on_device(tokens, last_only=last_only)
        return rows
    return HostRows(model.forward(tokens, last_only=last_only))
