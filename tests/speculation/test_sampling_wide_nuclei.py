"""The fast paths for wide top-p nuclei and large residuals, against the slow, obvious
computations they replace: the nucleus by a value sort (stable order's ties kept), the
candidate set sized from the missing mass, the flat-row probe, and the residual on
p's support alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.sampling import filters as sampling
from backends.sampling import nucleus, row_scans
from backends.sampling.filters import SamplingParams, distribution
from backends.sampling.nucleus import BEYOND, UNDECIDED, nucleus_in
from backends.sampling.sparse_distribution import SparseDistribution
from backends.speculation import rejection
from backends.speculation.rejection import residual
from tests.speculation.filter_reference import (
    QWEN_VOCAB,
    assert_same_filtering,
    near_a_threshold,
    record_calls,
)


def stable_nucleus(
    weights: np.ndarray, top_p: float, outside: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray] | object:
    """nucleus_in as it was: one stable argsort, the first ``count`` of it."""
    inside = float(weights.sum())
    low, high = top_p * (inside + outside[0]), top_p * (inside + outside[1])
    if inside < high:
        return BEYOND if inside < low else UNDECIDED
    order = np.argsort(-weights, kind="stable")
    cumulative = np.cumsum(weights[order])
    count = min(int(np.searchsorted(cumulative, high)) + 1, weights.size)
    if high != low and min(int(np.searchsorted(cumulative, low)) + 1, weights.size) != count:
        return UNDECIDED
    return order[:count], weights[order[:count]]


def tied_weights(rng: np.random.Generator, size: int) -> np.ndarray:
    """Weights in (0, 1] on a coarse grid, so many are equal, also where a cut falls."""
    weights = np.exp(-rng.integers(0, 12, size=size) / 2.0)
    weights[rng.integers(size)] = 1.0
    return weights


@pytest.mark.parametrize("size", [257, 1_000, 5_000, 32_768])
def test_the_value_sort_keeps_the_stable_argsorts_nucleus_ties_included(size: int) -> None:
    rng = np.random.default_rng(size)
    checked = 0
    for trial in range(40):
        weights = tied_weights(rng, size) if trial % 2 else rng.random(size) ** 8
        ids = np.sort(rng.choice(QWEN_VOCAB, size, replace=False)).astype(np.int64)
        top_p = float(rng.choice([0.1, 0.5, 0.9, 0.95, 0.999, 1.0]))
        extra = float(weights.sum()) * float(rng.choice([0.0, 0.01, 0.3]))
        for outside in ((extra, extra), (0.0, extra)):
            expected = stable_nucleus(weights, top_p, outside)
            got = nucleus_in(ids, weights, top_p, outside)
            if not isinstance(expected, tuple):
                assert got is expected
                continue
            assert isinstance(got, tuple)
            positions, kept = expected
            # The very same tokens (ties at the boundary taken in the same order) with
            # their very weights; the order they come in is free (finish sorts).
            np.testing.assert_array_equal(np.sort(got[0]), np.sort(ids[positions]))
            order = np.argsort(got[0])
            np.testing.assert_array_equal(got[1][order], kept[np.argsort(ids[positions])])
            assert np.all(np.diff(got[0]) > 0), "ascending ids stay ascending"
            checked += 1
    assert checked >= 30


def test_a_tie_across_the_nucleus_boundary_keeps_the_first_tied_positions() -> None:
    # 600 candidates: one heavy token, then 599 tied; top_p lands inside the tie.
    weights = np.full(600, 0.01)
    weights[300] = 1.0
    ids = np.arange(1_000, 1_600, dtype=np.int64)
    got = nucleus_in(ids, weights, 0.5, (0.0, 0.0))
    assert isinstance(got, tuple)
    expected = stable_nucleus(weights, 0.5, (0.0, 0.0))
    assert isinstance(expected, tuple)
    assert got[0].size == expected[0].size > 2
    np.testing.assert_array_equal(got[0], np.sort(ids[expected[0]]))
    # The tied tokens kept are the lowest positions, as a stable sort orders them.
    tied_kept = got[0][got[0] != 1_300]
    np.testing.assert_array_equal(tied_kept, ids[: tied_kept.size])


def test_a_nucleus_of_every_candidate_is_returned_whole() -> None:
    weights = np.linspace(1.0, 0.5, 400)
    ids = np.arange(400, dtype=np.int64)
    got = nucleus_in(ids, weights, 1.0, (0.0, 0.0))
    assert isinstance(got, tuple)
    np.testing.assert_array_equal(got[0], ids)
    np.testing.assert_array_equal(got[1], weights)


def wide_row(rng: np.random.Generator, lift: float, scale: float = 2.0) -> np.ndarray:
    """A tail of tens of thousands of tokens near the top, and a few lifted above it."""
    row = (rng.standard_normal(QWEN_VOCAB) * scale).astype(np.float32)
    row[rng.choice(QWEN_VOCAB, 6, replace=False)] += np.float32(lift)
    return row


@pytest.mark.parametrize("lift", [4.0, 8.0, 12.0, 16.0])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_p=0.95),
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=1.0, top_p=0.95, min_p=0.001),
    ],
    ids=["openai", "top_p_0.9", "chat_defaults", "top_p_with_min_p"],
)
def test_wide_rows_are_filtered_like_the_full_sort(lift: float, params: SamplingParams) -> None:
    # Nuclei from one token to tens of thousands: the flat-row probe, the general path
    # and its candidate sets sized from the missing mass.
    row = wide_row(np.random.default_rng(int(lift * 10)), lift)
    if near_a_threshold(row, params):
        pytest.skip("a decision within rounding of top_p or min_p")
    assert_same_filtering(distribution(row, params), row, params)


def test_a_nucleus_beyond_the_first_candidates_is_sized_from_the_missing_mass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    estimates = record_calls(monkeypatch, "tokens_for_mass")
    row = wide_row(np.random.default_rng(3), 6.0)
    params = SamplingParams(temperature=0.7, top_p=0.95)
    assert not near_a_threshold(row, params)
    got = distribution(row, params)
    assert estimates, "the first candidates were too few"
    assert got.ids.size > sampling._FIRST_CANDIDATES
    assert_same_filtering(got, row, params)


def test_a_sample_that_misjudges_the_missing_mass_still_finds_the_nucleus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The estimate is only a size: one far too small must widen, one far too large
    # must still give the same nucleus.
    row = wide_row(np.random.default_rng(4), 6.0)
    params = SamplingParams(temperature=0.7, top_p=0.95)
    expected = distribution(row, params)
    for guess in (1, QWEN_VOCAB):
        monkeypatch.setattr(sampling, "tokens_for_mass", lambda mass, below, size=guess: size)
        got = distribution(row, params)
        np.testing.assert_array_equal(got.ids, expected.ids)
        np.testing.assert_allclose(got.probs, expected.probs, rtol=1e-9)
    assert_same_filtering(expected, row, params)


def test_tokens_for_mass_reads_the_weights_row_mass_left() -> None:
    row = np.zeros(QWEN_VOCAB, dtype=np.float32)  # every weight 1
    total = row_scans.row_mass(row, 0.0, 1.0)
    assert total == QWEN_VOCAB
    stride = QWEN_VOCAB // row_scans.SAMPLE_SIZE
    assert row_scans.tokens_for_mass(1_000.0, 2.0) == -(-1_000 // stride) * stride
    assert row_scans.tokens_for_mass(2.0 * QWEN_VOCAB, 2.0) == QWEN_VOCAB
    assert row_scans.tokens_for_mass(5.0, 0.5) == QWEN_VOCAB, "no token that light"


def test_the_flat_probe_only_chooses_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # Near-top tokens exactly where the probe looks, and nowhere else: the probe calls
    # the row flat, the general path takes it, and the result is the full sort's.
    rng = np.random.default_rng(5)
    row = (rng.standard_normal(QWEN_VOCAB) - 30.0).astype(np.float32)
    probed = np.arange(0, QWEN_VOCAB, sampling._FLAT_PROBE_STRIDE)
    row[probed] = (rng.standard_normal(probed.size) + 10.0).astype(np.float32)
    general = record_calls(monkeypatch, "upper_set")
    params = SamplingParams(temperature=0.7, top_p=0.95)
    assert not near_a_threshold(row, params)
    assert sampling._near_top(row, int(row.argmax()), 0.7, 0, 0.95, 0.0) is None
    assert_same_filtering(distribution(row, params), row, params)
    assert general
    # The same tokens anywhere else: near the top, settled there.
    shifted = np.roll(row, 1)
    assert sampling._near_top(shifted, int(shifted.argmax()), 0.7, 0, 0.95, 0.0) is not None
    assert_same_filtering(distribution(shifted, params), shifted, params)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_p=1.0, top_k=QWEN_VOCAB + 5),
        SamplingParams(temperature=0.7, top_p=0.95, top_k=QWEN_VOCAB + 5),
        SamplingParams(temperature=1.0, top_p=0.5),
        SamplingParams(temperature=1.0, top_p=0.9, min_p=0.2),
    ],
    ids=["top_p_1_top_k_past_the_vocab", "top_k_past_the_vocab", "top_p_0.5", "min_p"],
)
def test_masked_tokens_never_enter_a_wide_nucleus(params: SamplingParams) -> None:
    # A grammar's -inf on about 100 tokens, 50 of them the row's likeliest.
    rng = np.random.default_rng(6)
    row = wide_row(rng, 5.0)
    masked = np.unique(np.concatenate((np.argsort(row)[-50:], rng.choice(QWEN_VOCAB, 50))))
    row[masked] = -np.inf
    got = distribution(row, params)
    assert np.all(got.probs_at(masked) == 0.0), "a masked token can never be drawn"
    if params.top_p >= 1.0:
        assert got.ids.size == QWEN_VOCAB  # no filter: the softmax of the whole row
        return
    assert not near_a_threshold(row, params)
    assert_same_filtering(got, row, params)


def test_all_mass_on_one_token_of_a_wide_row_is_a_point() -> None:
    row = wide_row(np.random.default_rng(7), 0.0)
    row[12_345] = 200.0
    got = distribution(row, SamplingParams(temperature=0.7, top_p=0.95))
    np.testing.assert_array_equal(got.ids, [12_345])
    np.testing.assert_array_equal(got.probs, [1.0])


def dense(distribution_: SparseDistribution, size: int) -> np.ndarray:
    values = np.zeros(size)
    values[distribution_.ids] = distribution_.probs
    return values


def sparse(rng: np.random.Generator, ids: np.ndarray) -> SparseDistribution:
    ids = np.sort(ids).astype(np.int64)
    return SparseDistribution(ids, rng.dirichlet(np.full(ids.size, 0.3)))


@pytest.mark.parametrize(
    "overlap", ["disjoint", "q_inside_p", "p_inside_q", "partial", "q_a_point", "equal"]
)
def test_the_residual_on_ps_support_is_the_positive_part_of_p_minus_q(overlap: str) -> None:
    rng = np.random.default_rng(len(overlap))
    vocab = 20_000
    ids = rng.choice(vocab, 6_000, replace=False)
    p_ids, q_ids = {
        "disjoint": (ids[:3_000], ids[3_000:]),
        "q_inside_p": (ids[:3_000], ids[:1_000]),
        "p_inside_q": (ids[:1_000], ids[:3_000]),
        "partial": (ids[:3_000], ids[2_000:5_000]),
        "q_a_point": (ids[:3_000], ids[:1]),
        "equal": (ids[:3_000], ids[:3_000]),
    }[overlap]
    p, q = sparse(rng, p_ids), sparse(rng, q_ids)
    assert p.ids.size + q.ids.size > rejection.PYTHON_CANDIDATES  # the numpy path
    excess = np.maximum(dense(p, vocab) - dense(q, vocab), 0.0)
    got = residual(p, q)
    assert np.all(np.diff(got.ids) > 0) and np.all(got.probs > 0)
    assert np.isin(got.ids, p.ids).all()
    np.testing.assert_allclose(dense(got, vocab), excess / excess.sum(), rtol=1e-12, atol=1e-15)


def test_the_residual_of_p_against_itself_is_p() -> None:
    p = sparse(np.random.default_rng(8), np.arange(0, 3_000, 3))
    assert residual(p, p) is p


def test_the_value_sort_limits_are_ordered() -> None:
    assert nucleus._ARGSORT_LIMIT < nucleus._SORT_LIMIT
