"""Calibration times every batch size and finds the batches that round like one-token decoding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.calibration import CALIBRATION_SIZES, EXACTNESS_CHECKED_UP_TO, measure_costs
from tests.fakes import HashModel, draft_model_for


class RoundsDifferentlyFrom(HashModel):
    """A model whose batches of ``threshold`` tokens or more use another kernel.

    Like llama.cpp's repacked CPU weights: the logits of a big batch differ from
    one-token decoding in the last bits.
    """

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        rows = np.array(super().forward(tokens, last_only=last_only))
        if len(tokens) >= self.threshold:
            rows += np.float32(1e-3)
        return rows


def test_every_size_is_timed_and_a_model_that_always_rounds_alike_is_exact_to_the_limit():
    target = HashModel()
    costs = measure_costs(target, draft_model_for(target))
    assert sorted(costs.target_seconds) == sorted(CALIBRATION_SIZES)
    assert all(seconds > 0 for seconds in costs.target_seconds.values())
    assert costs.draft_step_seconds is not None and costs.draft_step_seconds > 0
    assert costs.exact_batch_limit == EXACTNESS_CHECKED_UP_TO
    assert len(target.cached_tokens) == 0  # calibration leaves the cache empty


def test_batches_that_round_differently_set_the_exact_limit_below_them():
    costs = measure_costs(RoundsDifferentlyFrom(threshold=4))
    assert costs.exact_batch_limit == 3


def test_a_model_whose_batches_never_match_has_limit_one():
    costs = measure_costs(RoundsDifferentlyFrom(threshold=2))
    assert costs.exact_batch_limit == 1
