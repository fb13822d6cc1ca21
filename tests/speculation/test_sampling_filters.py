"""Filters (temperature, top-k, top-p, min-p) against a slow, obvious reference, and the
distributions they make: lookups, sampling, bad parameters.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from backends.sampling import row_scans
from backends.sampling.filters import SamplingParams, distribution, greedy_token
from backends.sampling.sparse_distribution import SparseDistribution
from tests.speculation.filter_reference import (
    QWEN_VOCAB,
    assert_same_filtering,
    near_a_threshold,
    record_calls,
    reference_filter,
)


def random_params(rng: np.random.Generator, n_vocab: int) -> SamplingParams:
    return SamplingParams(
        temperature=float(rng.choice([0.3, 0.7, 1.0, 1.8])),
        top_k=int(rng.choice([0, 0, 1, 3, 10, n_vocab - 1, n_vocab, n_vocab + 5])),
        top_p=float(rng.choice([1.0, 1.0, 0.97, 0.8, 0.5, 0.1])),
        min_p=float(rng.choice([0.0, 0.0, 0.02, 0.1, 0.5])),
    )


def test_filters_match_the_full_sort_reference_on_random_logits_with_ties() -> None:
    rng = np.random.default_rng(11)
    checked = 0
    for trial in range(600):
        n_vocab = int(rng.integers(2, 200))
        if trial % 2:
            # Half-integer logits on a small range: many exact ties, also at cut-offs.
            logits = (rng.integers(-8, 8, size=n_vocab) / 2).astype(np.float32)
        else:
            logits = (rng.normal(size=n_vocab) * rng.choice([0.5, 2.0, 6.0])).astype(np.float32)
        params = random_params(rng, n_vocab)
        if near_a_threshold(logits, params):
            continue
        assert_same_filtering(distribution(logits, params), logits, params)
        checked += 1
    assert checked > 550


@pytest.mark.parametrize(
    ("scale", "nucleus_size"),
    [
        (6.0, (2, 64)),
        (4.0, (65, 512)),
        (3.0, (513, 4096)),
        (2.0, (4097, 32_768)),
        (0.5, (32_769, 151_936)),
    ],
    ids=[
        "nucleus_in_first_guess_of_64",
        "nucleus_in_512",
        "nucleus_in_4096",
        "nucleus_in_32768",
        "nucleus_needs_the_full_vocab",
    ],
)
def test_top_p_on_a_151936_token_vocabulary_widens_until_the_nucleus_fits(
    scale: float, nucleus_size: tuple[int, int]
) -> None:
    rng = np.random.default_rng(12)
    logits = (rng.standard_normal(151_936) * scale).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_p=0.9)
    assert not near_a_threshold(logits, params)
    expected_ids, _ = reference_filter(logits, params)
    low, high = nucleus_size
    assert low <= expected_ids.size <= high, "the case exercises the intended path"
    assert_same_filtering(distribution(logits, params), logits, params)


def test_top_p_keeps_the_whole_vocabulary_when_the_nucleus_needs_every_token() -> None:
    logits = np.zeros(151_936, dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_p=0.9999999)
    got = distribution(logits, params)
    np.testing.assert_array_equal(got.ids, np.arange(151_936))
    assert_same_filtering(got, logits, params)


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_exactly_top_p() -> None:
    logits = np.zeros(4, dtype=np.float32)  # each token 0.25, exactly
    got = distribution(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert got.ids.size == 2
    np.testing.assert_array_equal(got.probs, [0.5, 0.5])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95),
        SamplingParams(temperature=1.0, min_p=0.05),
        SamplingParams(temperature=1.0, top_k=100, top_p=0.9, min_p=0.02),
        SamplingParams(temperature=1.0),
    ],
    ids=["top_k_then_top_p", "min_p_alone", "all_filters", "no_filter"],
)
def test_filters_on_a_151936_token_vocabulary_match_the_reference(params: SamplingParams) -> None:
    rng = np.random.default_rng(13)
    logits = (rng.standard_normal(151_936) * 3.0).astype(np.float32)
    assert not near_a_threshold(logits, params)
    got = distribution(logits, params)
    assert_same_filtering(got, logits, params)
    if params.top_k:
        assert got.ids.size <= params.top_k


def test_no_filter_gives_the_softmax_of_logits_over_temperature() -> None:
    logits = np.array([1.0, 2.0, 0.5, -1.0, 2.0], dtype=np.float32)
    got = distribution(logits, SamplingParams(temperature=0.5))
    np.testing.assert_array_equal(got.ids, np.arange(5))
    expected = np.exp(logits.astype(np.float64) / 0.5)
    np.testing.assert_allclose(got.probs, expected / expected.sum(), rtol=1e-12)


def test_top_k_one_and_tiny_top_p_keep_only_the_most_likely_token() -> None:
    logits = np.array([0.1, 3.0, 2.9, -5.0], dtype=np.float32)
    for params in (
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.0, top_p=1e-9),
        SamplingParams(temperature=1.0, min_p=0.999),
    ):
        got = distribution(logits, params)
        np.testing.assert_array_equal(got.ids, [1])
        np.testing.assert_array_equal(got.probs, [1.0])


def test_masked_logits_never_get_probability() -> None:
    logits = np.array([-np.inf, 1.0, -np.inf, 0.0], dtype=np.float32)
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.99)):
        got = distribution(logits, params)
        assert got.prob_of(0) == 0.0 and got.prob_of(2) == 0.0
        assert math.isclose(got.prob_of(1) + got.prob_of(3), 1.0)


def test_greedy_picks_the_first_of_tied_maxima() -> None:
    logits = np.array([0.0, 5.0, -1.0, 5.0], dtype=np.float32)
    assert greedy_token(logits) == 1
    assert SamplingParams().greedy and SamplingParams(temperature=0.0, top_k=3).greedy
    point = distribution(logits, SamplingParams(temperature=0.0, top_p=0.5))
    np.testing.assert_array_equal(point.ids, [1])
    np.testing.assert_array_equal(point.probs, [1.0])


def test_greedy_token_is_the_argmax_on_random_rows() -> None:
    rng = np.random.default_rng(14)
    for _ in range(200):
        row = rng.normal(size=int(rng.integers(1, 300))).astype(np.float32)
        assert greedy_token(row) == int(np.argmax(row))


@pytest.mark.parametrize("flat", [False, True], ids=["peaked", "flat"])
def test_a_drafters_confidence_is_the_softmax_of_its_token_to_a_thousandth(
    flat: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Peaked rows sum the tokens near the top; a flat one (tens of thousands near it)
    # is summed whole in one float32 pass instead.
    whole_row_passes = record_calls(monkeypatch, "row_mass", row_scans)
    rng = np.random.default_rng(15)
    for peak in (14.0, 18.0, 25.0):
        row = (rng.standard_normal(QWEN_VOCAB) * (0.5 if flat else 2.4)).astype(np.float32)
        token = int(rng.integers(QWEN_VOCAB))
        row[token] = row.max() + (0.1 if flat else peak)
        scaled = row.astype(np.float64)
        exact = 1.0 / np.exp(scaled - scaled[token]).sum()
        assert row_scans.top_token_probability(row, token) == pytest.approx(exact, rel=1e-3)
    assert bool(whole_row_passes) == flat


def test_sparse_distribution_looks_up_probabilities_inside_and_outside_its_support() -> None:
    dist = SparseDistribution(np.array([3, 7, 20], dtype=np.int64), np.array([0.2, 0.5, 0.3]))
    assert dist.prob_of(7) == 0.5
    assert dist.prob_of(3) == 0.2 and dist.prob_of(20) == 0.3
    assert dist.prob_of(0) == 0.0 and dist.prob_of(5) == 0.0 and dist.prob_of(99) == 0.0
    tokens = np.array([0, 3, 4, 7, 19, 20, 21, 1000])
    np.testing.assert_array_equal(dist.probs_at(tokens), [0, 0.2, 0, 0.5, 0, 0.3, 0, 0])
    assert dist.top_prob == 0.5


def test_sparse_distribution_samples_follow_its_probabilities() -> None:
    dist = SparseDistribution(
        np.array([2, 5, 6, 9, 11], dtype=np.int64), np.array([0.0, 0.1, 0.45, 0.0, 0.45])
    )
    rng = np.random.default_rng(15)
    n = 20_000
    samples = np.array([dist.sample(rng) for _ in range(n)])
    assert set(np.unique(samples).tolist()) <= {5, 6, 11}, "zero-probability ids are never drawn"
    counts = np.array([np.sum(samples == token) for token in (5, 6, 11)]) / n
    # TV bound as in test_sampling_lossless (3 outcomes, failure probability 1e-6).
    bound = 0.5 * math.sqrt(3 / n) + math.sqrt(math.log(1e6) / (2 * n))
    assert 0.5 * np.abs(counts - [0.1, 0.45, 0.45]).sum() <= bound


@pytest.mark.parametrize("size", [2, 7, 256, 257, 4096])
def test_small_and_large_distributions_draw_the_same_token_for_the_same_number(size: int) -> None:
    # Up to _PYTHON_CANDIDATES tokens are drawn by a running sum in Python, larger
    # ones with numpy: for one random number both pick the token one cumulative sum
    # and search pick (larger rows, walked by blocks, are tested below).
    rng = np.random.default_rng(size)
    probs = rng.dirichlet(np.full(size, 0.3))
    probs[rng.integers(size)] = 0.0  # a zero-probability token is never drawn
    dist = SparseDistribution(np.sort(rng.choice(100_000, size, replace=False)), probs)
    cumulative = np.cumsum(probs)
    draws, numbers = np.random.default_rng(7), np.random.default_rng(7)
    for _ in range(300):
        index = int(np.searchsorted(cumulative, numbers.random() * cumulative[-1], "right"))
        assert dist.sample(draws) == int(dist.ids[min(index, size - 1)])
    assert dist.top_prob == probs.max()


def test_point_distribution_always_samples_its_token() -> None:
    point = SparseDistribution.point(42)
    rng = np.random.default_rng(16)
    assert {point.sample(rng) for _ in range(50)} == {42}
    assert point.prob_of(42) == 1.0 and point.prob_of(41) == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": -0.5},
        {"top_p": 1.01},
        {"top_p": float("nan")},
        {"min_p": -0.01},
        {"min_p": 1.0},
        {"min_p": float("nan")},
    ],
    ids=lambda bad: "-".join(f"{key}={value}" for key, value in bad.items()),
)
def test_bad_sampling_params_raise_value_error(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)  # type: ignore[arg-type]


def test_boundary_sampling_params_are_accepted() -> None:
    SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
    SamplingParams(temperature=2.0, top_k=1, top_p=1e-6, min_p=0.999)
