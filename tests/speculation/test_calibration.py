"""Calibration times every batch size and finds the batches that round like one-token decoding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from backends.errors import ContextOverflowError
from backends.speculation.calibration import (
    CALIBRATION_SIZES,
    EXACTNESS_CHECKED_UP_TO,
    MEASURED_POSITION,
    measure_costs,
)
from tests.support.fakes import HashModel, draft_model_for


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


class DecodesDifferentlyPast(HashModel):
    """A model whose one-token decoding changes kernel past a context length.

    Like llama.cpp's CPU attention with an F16 V cache: from 512 cache cells on, a
    single token's attention is split across threads and rounds differently from the
    same row in a batch.
    """

    def __init__(self, position: int, n_ctx: int) -> None:
        super().__init__(n_ctx=n_ctx)
        self.position = position

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        past = len(self.cached_tokens) >= self.position
        rows = np.array(super().forward(tokens, last_only=last_only))
        if len(tokens) == 1 and past:
            rows += np.float32(1e-3)
        return rows


def test_every_size_is_timed_and_a_model_that_always_rounds_alike_is_exact_to_the_limit():
    target = HashModel(n_ctx=1024)  # deep enough for the usual position
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


def test_the_target_is_measured_past_512_cells_where_one_token_decoding_may_switch():
    # The probe tokens sit just past 512 cells: a switch there is seen, one after them is not.
    seen = measure_costs(DecodesDifferentlyPast(513, n_ctx=1024))
    after = MEASURED_POSITION + EXACTNESS_CHECKED_UP_TO
    unseen = measure_costs(DecodesDifferentlyPast(after, n_ctx=1024))
    assert (seen.exact_batch_limit, unseen.exact_batch_limit) == (1, EXACTNESS_CHECKED_UP_TO)


def test_a_context_too_short_for_that_position_is_measured_as_deep_as_it_goes():
    target = DecodesDifferentlyPast(position=512, n_ctx=512)  # never decodes that far
    assert measure_costs(target).exact_batch_limit == EXACTNESS_CHECKED_UP_TO
    with pytest.raises(ContextOverflowError, match=r"too short to calibrate.*Raise the context"):
        measure_costs(HashModel(n_ctx=48))
