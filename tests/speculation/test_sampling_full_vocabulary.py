"""Filtering a whole LLM-sized vocabulary without sorting it: the candidate set, ties at its
boundary, its exact fallback, sampling in blocks, and rows known only by their top tokens.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from backends.sampling import filters as sampling
from backends.sampling import row_scans, sparse_distribution, top_logits
from backends.sampling.filters import SamplingParams, distribution
from tests.speculation.filter_reference import (
    QWEN_VOCAB,
    assert_same_filtering,
    llm_like_row,
    near_a_threshold,
    peaked_row,
)


def misleading_row() -> np.ndarray:
    """High logits at exactly the positions a strided sample reads, low elsewhere.

    A cut-off estimated from that sample lets through far fewer tokens than it
    expects, so selection must fall back to an exact partition of the whole row.
    """
    rng = np.random.default_rng(21)
    row = (rng.standard_normal(QWEN_VOCAB) * 0.5 - 8.0).astype(np.float32)
    stride = QWEN_VOCAB // row_scans.SAMPLE_SIZE
    sampled = np.arange(0, QWEN_VOCAB, stride)
    row[sampled] = (rng.standard_normal(sampled.size) * 0.5 + 6.0).astype(np.float32)
    return row


def test_a_candidate_set_too_small_falls_back_to_exact_selection() -> None:
    row = misleading_row()
    at_least = 3000  # more than the sampled positions the estimate lets through
    ids = row_scans.upper_set(row, at_least)
    assert ids.size >= at_least
    outside = np.setdiff1d(np.arange(QWEN_VOCAB), ids)
    assert row[outside].max() < row[ids].min(), "the candidates are the top of the row"
    for params in (
        SamplingParams(temperature=1.0, top_k=3000),
        SamplingParams(temperature=1.0, top_k=2500, top_p=0.9),
        SamplingParams(temperature=1.0, top_p=0.999),
    ):
        assert not near_a_threshold(row, params)
        assert_same_filtering(distribution(row, params), row, params)


def test_ties_at_the_top_k_boundary_keep_as_many_tokens_as_the_full_sort() -> None:
    rng = np.random.default_rng(22)
    row = (rng.standard_normal(QWEN_VOCAB) - 5.0).astype(np.float32)
    clear = rng.choice(QWEN_VOCAB, size=80, replace=False)
    row[clear[:30]] = np.linspace(4.0, 9.0, 30, dtype=np.float32)
    row[clear[30:]] = 3.0  # 50 tokens tied where top-k 40 cuts: 10 of them are kept
    for params in (
        SamplingParams(temperature=0.7, top_k=40),
        SamplingParams(temperature=1.3, top_k=40, min_p=0.001),
        SamplingParams(temperature=2.0, top_k=40, top_p=0.9999),
    ):
        assert not near_a_threshold(row, params)
        got = distribution(row, params)
        assert got.ids.size == 40, "no filter after top-k cuts into the tie"
        assert int(np.sum(row[got.ids] == 3.0)) == 10
        assert_same_filtering(got, row, params)


def test_top_k_selection_is_exact_at_every_boundary_of_a_tied_row() -> None:
    # Every logit one of four values: each top-k cuts through a huge tie.
    row = np.random.default_rng(23).integers(0, 4, size=QWEN_VOCAB).astype(np.float32)
    for top_k in (1, 5, 300, 50_000):
        params = SamplingParams(temperature=1.0, top_k=top_k)
        got = distribution(row, params)
        assert got.ids.size == top_k
        assert_same_filtering(got, row, params)


@pytest.mark.parametrize("peak", [4.0, 8.0, 12.0, 20.0])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_p=0.95),
        SamplingParams(temperature=0.7, top_p=0.5),
        SamplingParams(temperature=1.0, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=1.0, top_p=0.99, min_p=0.001),
        SamplingParams(temperature=0.7, min_p=0.05),
    ],
    ids=["top_p_0.95", "top_p_0.5", "top_p_and_min_p", "wide_top_p_and_small_min_p", "min_p"],
)
def test_llm_like_rows_match_the_full_sort_reference(params: SamplingParams, peak: float) -> None:
    # Low peaks give nuclei of thousands of tokens (widening, outside-mass passes),
    # high ones a few tokens that the bound on the rest decides alone.
    rng = np.random.default_rng(int(peak * 100))
    for _ in range(3):
        row = llm_like_row(rng, peak)
        if near_a_threshold(row, params):
            continue
        assert_same_filtering(distribution(row, params), row, params)


def test_top_p_is_decided_with_and_without_a_pass_over_the_rest_of_the_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes: list[int] = []
    real_row_mass = sampling.row_mass

    def counting(*args: object) -> float:
        passes.append(1)
        return real_row_mass(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(sampling, "row_mass", counting)
    params = SamplingParams(temperature=0.7, top_p=0.9)
    rng = np.random.default_rng(24)
    decided_by_bound = needed_a_pass = 0
    for peak in (30.0, 9.0, 7.0, 5.0):
        for _ in range(3):
            row = llm_like_row(rng, peak)
            if near_a_threshold(row, params):
                continue
            before = len(passes)
            assert_same_filtering(distribution(row, params), row, params)
            if len(passes) == before:
                decided_by_bound += 1
            else:
                needed_a_pass += 1
    assert decided_by_bound and needed_a_pass, "both paths ran"


def test_sampling_a_full_vocabulary_distribution_walks_blocks_like_one_cumulative_sum() -> None:
    rng = np.random.default_rng(25)
    probs = rng.random(QWEN_VOCAB) ** 8
    probs[rng.choice(QWEN_VOCAB, size=5000, replace=False)] = 0.0
    probs /= probs.sum()
    cumulative = np.cumsum(probs)
    for u in rng.random(2000):
        plain = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
        plain = min(plain, probs.size - 1)
        got = sparse_distribution._inverse_cdf(probs, float(u))
        # Summing block by block rounds differently: only a neighbour at a boundary may differ.
        assert abs(got - plain) <= 1
        assert probs[got] > 0.0


def test_full_vocabulary_samples_follow_the_softmax() -> None:
    logits = np.full(QWEN_VOCAB, -np.inf, dtype=np.float32)
    support = np.array([3, 1500, 70_000, 151_935])
    logits[support] = [0.0, 1.0, 2.0, 0.5]
    dist = distribution(logits, SamplingParams(temperature=1.0))
    assert dist.ids.size == QWEN_VOCAB
    rng = np.random.default_rng(26)
    n = 20_000
    samples = np.array([dist.sample(rng) for _ in range(n)])
    assert set(np.unique(samples).tolist()) <= set(support.tolist())
    counts = np.array([np.sum(samples == token) for token in support]) / n
    expected = np.exp(logits[support].astype(np.float64))
    expected /= expected.sum()
    bound = 0.5 * math.sqrt(4 / n) + math.sqrt(math.log(1e6) / (2 * n))
    assert 0.5 * np.abs(counts - expected).sum() <= bound


# -- a row known by its top tokens (a runtime that filters on its device) -------------


def top_of(row: np.ndarray, count: int, temperature: float) -> tuple[np.ndarray, np.ndarray, float]:
    """What a device brings back: the ``count`` largest logits and log-sum-exp at T."""
    ids = np.argpartition(-row, count - 1)[:count]
    scaled = row.astype(np.float64) / temperature
    top = scaled.max()
    return ids, row[ids], float(top + np.log(np.exp(scaled - top).sum()))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_p=0.95),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=1.0, top_k=20),
        SamplingParams(temperature=1.3, min_p=0.1),
        SamplingParams(temperature=1.0, top_p=0.8, min_p=0.02),
    ],
    ids=["openai", "chat_defaults", "top_k", "min_p", "top_p_and_min_p"],
)
def test_a_row_known_by_its_top_64_filters_like_the_full_sort(params: SamplingParams) -> None:
    rng = np.random.default_rng(41)
    settled = 0
    for gaps in ([], [0.5], [1.0, 2.0, 3.0], [0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5]):
        row = peaked_row(rng, gaps)
        if near_a_threshold(row, params):
            continue
        got = top_logits.distribution_from_top(
            *top_of(row, 64, params.temperature), QWEN_VOCAB, params
        )
        if got is not None:
            assert_same_filtering(got, row, params)
            settled += 1
    assert settled >= 3


def test_a_row_known_by_its_top_tokens_is_refused_where_they_cannot_settle_it() -> None:
    row = llm_like_row(np.random.default_rng(42), 4.0)  # a nucleus of thousands
    for params in (
        SamplingParams(temperature=0.7, top_p=0.95),  # the nucleus reaches past 64
        SamplingParams(temperature=0.7, top_k=100),  # top-k beyond the candidates
        SamplingParams(temperature=0.7, min_p=0.0001),  # min-p keeps more than 64
        SamplingParams(temperature=0.7),  # no filter: the whole row
    ):
        assert top_logits.distribution_from_top(*top_of(row, 64, 0.7), QWEN_VOCAB, params) is None


def test_the_rest_of_the_row_is_trusted_only_to_the_devices_precision() -> None:
    # The top token alone holds just under top_p of the mass: a device sum off by more
    # than its slack could decide it either way, so it is not decided on the device.
    row = np.full(QWEN_VOCAB, -5.0, dtype=np.float32)
    row[9] = 10.0
    ids, values, log_mass = top_of(row, 64, 1.0)
    share = float(np.exp(10.0 - log_mass))
    near = SamplingParams(temperature=1.0, top_p=share * (1 + top_logits._DEVICE_MASS_SLACK / 4))
    assert top_logits.distribution_from_top(ids, values, log_mass, QWEN_VOCAB, near) is None
    clear = SamplingParams(temperature=1.0, top_p=share * (1 - 4 * top_logits._DEVICE_MASS_SLACK))
    got = top_logits.distribution_from_top(ids, values, log_mass, QWEN_VOCAB, clear)
    assert got is not None
    np.testing.assert_array_equal(got.ids, [9])
