"""The slow, obvious reference the sampling filters are held to, and the rows they are
tried on.

The reference sorts the whole vocabulary once and applies each filter in the textbook
way; the filters' fast paths must keep the same tokens and give them the same
probabilities.
"""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np
import pytest

from backends.sampling import filters as sampling
from backends.sampling.filters import SamplingParams
from backends.sampling.sparse_distribution import SparseDistribution


def reference_filter(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Kept ids (most likely first) and their probabilities, by one full sort."""
    scaled = logits.astype(np.float64) / params.temperature
    order = np.argsort(-scaled, kind="stable")
    if 0 < params.top_k < order.size:
        order = order[: params.top_k]
    values = scaled[order]
    probs = np.exp(values - values[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        cumulative = np.cumsum(probs)
        count = next(
            (index + 1 for index, mass in enumerate(cumulative) if mass >= params.top_p),
            order.size,
        )
        order, probs = order[:count], probs[:count]
    if params.min_p > 0.0:
        keep = probs >= params.min_p * probs[0]
        order, probs = order[keep], probs[keep]
    return order, probs / probs.sum()


def near_a_threshold(logits: np.ndarray, params: SamplingParams) -> bool:
    """Whether a kept/dropped decision is within rounding of top_p or min_p.

    There the reference and the code may round differently; such draws are skipped.
    """
    scaled = logits.astype(np.float64) / params.temperature
    order = np.argsort(-scaled, kind="stable")
    if 0 < params.top_k < order.size:
        order = order[: params.top_k]
    probs = np.exp(scaled[order] - scaled[order[0]])
    probs /= probs.sum()
    if params.top_p < 1.0 and np.min(np.abs(np.cumsum(probs) - params.top_p)) < 1e-9:
        return True
    return params.min_p > 0.0 and np.min(np.abs(probs / probs[0] - params.min_p)) < 1e-9


def assert_same_filtering(
    got: SparseDistribution, logits: np.ndarray, params: SamplingParams
) -> None:
    scaled = logits.astype(np.float64) / params.temperature
    expected_ids, expected_probs = reference_filter(logits, params)
    assert got.ids.dtype == np.int64
    assert np.all(np.diff(got.ids) > 0), "ids are sorted and unique"
    assert got.ids.size == expected_ids.size
    np.testing.assert_array_equal(np.sort(scaled[got.ids]), np.sort(scaled[expected_ids]))
    dropped = np.setdiff1d(np.arange(logits.size), got.ids)
    if dropped.size:
        assert scaled[dropped].max() <= scaled[got.ids].min(), "a dropped token beats a kept one"
    assert math.isclose(got.probs.sum(), 1.0, rel_tol=1e-12)
    # Equal logits get equal probabilities, so compare in logit order.
    np.testing.assert_allclose(
        got.probs[np.argsort(-scaled[got.ids], kind="stable")],
        expected_probs,
        rtol=1e-9,
        atol=1e-300,
    )


# -- the partial-selection paths on a full-size vocabulary ------------------------------
#
# distribution() never sorts the vocabulary: it picks a candidate set from a strided
# sample of the row, bounds the mass left outside it, and widens when the nucleus does
# not fit. These rows are built to drive each of those paths; every result must equal
# the full-sort reference above.

QWEN_VOCAB = 151_936


def llm_like_row(rng: np.random.Generator, peak: float, favoured: int = 8) -> np.ndarray:
    """A broad normal tail and a few favoured tokens ``peak``-ish above it."""
    row = rng.standard_normal(QWEN_VOCAB).astype(np.float32) * 2.0
    tokens = rng.choice(QWEN_VOCAB, size=favoured, replace=False)
    row[tokens] += rng.uniform(0.4 * peak, peak, size=favoured).astype(np.float32)
    return row


# -- the first try: tokens near the row's maximum ---------------------------------------
#
# An LLM's rows are peaked: the likeliest token stands ~25-30 logits above the bulk of
# the vocabulary (measured on the starter pair), so distribution() first takes the
# tokens within T * _NEAR_TOP_NATS of the maximum and bounds everything below. These
# rows drive each way out of that path; every result must equal the full-sort reference.


def peaked_row(rng: np.random.Generator, runner_up_gaps: list[float]) -> np.ndarray:
    """A starter-pair-like row: a broad tail, a top token 28 above it, runners-up below."""
    row = (rng.standard_normal(QWEN_VOCAB) * 2.4).astype(np.float32)
    tokens = rng.choice(QWEN_VOCAB, size=1 + len(runner_up_gaps), replace=False)
    row[tokens[0]] = 28.0
    row[tokens[1:]] = 28.0 - np.asarray(runner_up_gaps, dtype=np.float32)
    return row


def record_calls(
    monkeypatch: pytest.MonkeyPatch, name: str, module: ModuleType = sampling
) -> list[object]:
    """What each call of one of a sampling module's functions (as it calls it) returned."""
    results: list[object] = []
    real = getattr(module, name)

    def recording(*args: object, **kwargs: object) -> object:
        results.append(real(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(module, name, recording)
    return results
