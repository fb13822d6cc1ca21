"""Presence and frequency penalties: lower the logits of tokens the reply already holds.

OpenAI's definition: a token emitted ``c > 0`` times so far in this reply has its logit
lowered by ``presence_penalty + frequency_penalty * c`` (negative values raise it).
Prompt tokens do not count; every emitted token does (grammar-forced ones included).

Why a counter the loop owns: speculation stays exact only when the target's p and the
draft's q are transformed identically. Position i of a verify is the token after the
accepted prefix and drafts 0..i-1, so its row is penalised with the counts *after*
those drafts; the draft model drafted that position from the same counts. The loop
adds each token to :class:`TokenCounts` as it commits it (an accepted draft, then the
correction or bonus), and a model drafter adds its own drafts while it drafts and takes
them off again afterwards, so both sides always see the counts of the same prefix.

Cost: the penalty touches only tokens seen so far (sparse), on a copy of the row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# OpenAI's range for both penalties.
PENALTY_RANGE = (-2.0, 2.0)


class TokenCounts:
    """How often each token occurs in the reply so far, and the penalised rows that follow.

    Not thread-safe; one per generation.
    """

    def __init__(self, presence: float, frequency: float) -> None:
        low, high = PENALTY_RANGE
        for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
            if not low <= value <= high:  # also refuses NaN
                raise ValueError(f"{name} must be between {low:g} and {high:g}, got {value}")
        self.presence = presence
        self.frequency = frequency
        self._counts: dict[int, int] = {}
        # The (ids, amounts) arrays of the counts above, rebuilt only after a change.
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    @staticmethod
    def for_penalties(presence: float, frequency: float) -> TokenCounts | None:
        """A counter for these penalties, or None when both are 0 (nothing to apply)."""
        if presence == 0.0 and frequency == 0.0:
            return None
        return TokenCounts(presence, frequency)

    def add(self, tokens: Sequence[int]) -> None:
        """Count ``tokens`` as emitted (or tentatively drafted)."""
        for token in tokens:
            self._counts[int(token)] = self._counts.get(int(token), 0) + 1
        if tokens:
            self._arrays = None

    def remove(self, tokens: Sequence[int]) -> None:
        """Take back tokens :meth:`add` counted (a drafter's tentative drafts)."""
        for token in tokens:
            left = self._counts[int(token)] - 1
            if left:
                self._counts[int(token)] = left
            else:
                del self._counts[int(token)]
        if tokens:
            self._arrays = None

    def count(self, token: int) -> int:
        """How often ``token`` was counted."""
        return self._counts.get(int(token), 0)

    def apply(self, row: np.ndarray) -> np.ndarray:
        """``row`` with every counted token's logit lowered by its penalty (a copy).

        The row itself is left alone: runtimes hand out views of their own buffers.
        A row with nothing counted yet is returned as it is.
        """
        if not self._counts:
            return row
        ids, amounts = self._penalty_arrays()
        penalised = np.array(row, copy=True)
        # -inf (a token a grammar or the model rules out) stays -inf.
        penalised[ids] -= amounts.astype(penalised.dtype, copy=False)
        return penalised

    def _penalty_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float64, count=len(self._counts))
            self._arrays = (ids, self.presence + self.frequency * counts)
        return self._arrays
