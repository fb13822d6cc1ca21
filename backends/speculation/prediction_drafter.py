"""Drafts from the caller's prediction of the output (OpenAI's Predicted Outputs)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.sampling.filters import SamplingParams
from backends.speculation.proposal import EMPTY_PROPOSAL, DraftProposal
from backends.token_prefix import common_prefix_length


class PredictionDrafter:
    """Drafts from a caller-supplied prediction of the output.

    Follows the prediction with a cursor: while the output agrees with it, the next
    stretch after the cursor is proposed; after a divergence, the output's last
    tokens are looked up in the prediction (n-gram match) to find where to resume.
    """

    name = "prediction"

    def __init__(self, prediction_tokens: Sequence[int], sizes: Sequence[int] = (8, 4, 2, 1)):
        self.prediction = list(prediction_tokens)
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        self._prompt_length = 0
        self._anchor_output = 0
        self._anchor_prediction = 0
        self._positions: dict[tuple[int, ...], list[int]] = {}
        for size in self.sizes:
            for end in range(size - 1, len(self.prediction)):
                key = tuple(self.prediction[end + 1 - size : end + 1])
                self._positions.setdefault(key, []).append(end)

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """The output starts right after the prompt; the prediction from its start."""
        self._prompt_length = len(prompt_tokens)
        self._anchor_output = 0
        self._anchor_prediction = 0

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> DraftProposal:
        """The next stretch of the prediction after the output so far."""
        if max_tokens <= 0 or not self.prediction:
            return EMPTY_PROPOSAL
        output = context[self._prompt_length :]
        start = self._locate(output)
        if start is None or start >= len(self.prediction):
            return EMPTY_PROPOSAL
        self._anchor_output, self._anchor_prediction = len(output), start
        return DraftProposal(tokens=self.prediction[start : start + max_tokens])

    def _locate(self, output: Sequence[int]) -> int | None:
        """Index in the prediction of the token expected next, or None."""
        if not output:
            return 0
        # Fast path: since the last proposal the output kept following the prediction.
        grown = len(output) - self._anchor_output
        followed = self._anchor_prediction  # the output has written the prediction up to here
        if grown >= 0:
            expected = self.prediction[self._anchor_prediction : self._anchor_prediction + grown]
            if len(expected) == grown and list(output[self._anchor_output :]) == expected:
                return self._anchor_prediction + grown
            followed += common_prefix_length(output[self._anchor_output :], expected)
        for size in self.sizes:
            if len(output) < size:
                continue
            ends = self._positions.get(tuple(output[-size:]))
            if not ends:
                continue
            # Prefer the first occurrence after what the output already followed:
            # predictions are followed front to back.
            later = [end for end in ends if end + 1 >= followed]
            end = later[0] if later else ends[-1]
            if end + 1 < len(self.prediction):
                return end + 1
        return None
