"""Filters (temperature, top-k, top-p, min-p) against a slow, obvious reference.

The reference sorts the whole vocabulary once and applies each filter in the
documented order to the sorted list. Ties make "which of the tied tokens is kept"
a free choice, so results are compared by what is well defined: the multiset of kept
logits, the rule that no dropped token beats a kept one, and the probabilities.
"""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np
import pytest

from backends.sampling import filters as sampling
from backends.sampling import row_scans, sparse_distribution, top_logits
from backends.sampling.filters import SamplingParams, distribution, greedy_token
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


PEAKED_PARAMS = [
    SamplingParams(temperature=0.7, top_p=0.95),
    SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=0.7, top_k=5, top_p=0.99),
    SamplingParams(temperature=0.7, top_p=0.999, min_p=0.01),
]


@pytest.mark.parametrize(
    "params",
    PEAKED_PARAMS,
    ids=["openai", "chat_defaults", "top_p_0.9", "top_k_top_p", "wide_with_min_p"],
)
def test_peaked_rows_are_filtered_near_the_top_like_the_full_sort(
    params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    near_top = record_calls(monkeypatch, "_near_top")
    rng = np.random.default_rng(31)
    checked = 0
    for gaps in ([], [0.5], [1.0, 2.0, 3.0], [0.1, 0.2, 4.0, 6.0, 9.0], [3.0] * 12):
        # (Filters without top-p are not here: top-k alone wants every one of its k
        # tokens, min-p alone has a cut of its own; both take the general path.)
        for _ in range(2):
            row = peaked_row(rng, gaps)
            if near_a_threshold(row, params):
                continue
            got = distribution(row, params)
            assert_same_filtering(got, row, params)
            checked += 1
    assert checked >= 8
    assert len(near_top) == checked and None not in near_top, "all settled near the top"


def test_a_top_token_that_alone_reaches_top_p_is_the_whole_nucleus() -> None:
    row = peaked_row(np.random.default_rng(32), [6.0, 7.0])
    params = SamplingParams(temperature=0.7, top_p=0.95)
    got = distribution(row, params)
    np.testing.assert_array_equal(got.ids, [int(np.argmax(row))])
    np.testing.assert_array_equal(got.probs, [1.0])
    assert_same_filtering(got, row, params)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_p=0.95),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
    ],
    ids=["openai", "chat_defaults"],
)
def test_a_dominant_top_token_among_many_candidates_is_kept_alone_without_sorting(
    params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 300 runners-up within the near-top cut (more than plain Python filters; numpy
    # does) but far enough below that the top token alone reaches top_p.
    rng = np.random.default_rng(38)
    assert sparse_distribution.PYTHON_CANDIDATES < 300
    row = peaked_row(rng, list(rng.uniform(9.0, 12.0, size=300)))
    nucleus_searches = record_calls(monkeypatch, "nucleus_in")
    got = distribution(row, params)
    np.testing.assert_array_equal(got.ids, [int(np.argmax(row))])
    assert not nucleus_searches, "decided from the candidates' total"
    assert_same_filtering(got, row, params)
    # Nearer runners-up share the nucleus: then it is searched for as before.
    close = peaked_row(rng, list(rng.uniform(1.0, 4.0, size=300)))
    assert distribution(close, params).ids.size > 1 and nucleus_searches


def test_tied_top_tokens_keep_the_first_when_one_reaches_top_p() -> None:
    row = peaked_row(np.random.default_rng(33), [0.0, 9.0])  # two tokens tie at the top
    tied = np.flatnonzero(row == row.max())
    assert tied.size == 2
    got = distribution(row, SamplingParams(temperature=0.7, top_p=0.4))
    np.testing.assert_array_equal(got.ids, tied[:1])


def test_a_flat_row_skips_the_near_top_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    general = record_calls(monkeypatch, "upper_set")
    row = llm_like_row(np.random.default_rng(34), 4.0)  # thousands within reach of the top
    params = SamplingParams(temperature=0.7, top_p=0.95)
    assert not near_a_threshold(row, params)
    assert sampling._near_top(row, 0.7, 0, 0.95, 0.0) is None
    assert_same_filtering(distribution(row, params), row, params)
    assert general, "the general path ran"


def test_top_p_that_the_bound_cannot_decide_sums_the_tokens_below_the_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One token at the top; every other token just below the cut, weighing together
    # about 1e-4 of it. With top_p between 1 / (1 + 1e-4) and 1 the bound cannot tell
    # whether the top token alone reaches top_p; the true mass says it does not.
    depth = 1.0 * sampling._NEAR_TOP_NATS
    row = np.full(QWEN_VOCAB, 10.0 - depth - 0.01, dtype=np.float32)
    row[77] = 10.0
    rest = float(np.exp(np.float64(row[0]) - 10.0)) * (QWEN_VOCAB - 1)
    params = SamplingParams(temperature=1.0, top_p=1.0 / (1.0 + rest / 2))
    passes = record_calls(monkeypatch, "row_mass")
    got = distribution(row, params)
    assert passes, "the rest of the row was summed"
    assert got.ids.size > 1 and 77 in got.ids.tolist()
    assert_same_filtering(got, row, params)
    # Where the true mass settles it the other way, the top token is kept alone.
    alone = distribution(row, SamplingParams(temperature=1.0, top_p=1.0 / (1.0 + 2 * rest)))
    np.testing.assert_array_equal(alone.ids, [77])


def test_a_top_k_set_reaching_below_the_cut_bounds_the_rest_of_it() -> None:
    row = peaked_row(np.random.default_rng(35), [1.0])  # two tokens near the top
    # top_p so close to 1 that the bound on the 38 below the cut cannot settle it.
    params = SamplingParams(temperature=0.7, top_k=40, top_p=1.0 - 1e-15)
    assert sampling._near_top(row, 0.7, 40, params.top_p, 0.0) is None
    assert_same_filtering(distribution(row, params), row, params)
    # With top_p 0.95 the bound on the 38 below the cut settles it near the top.
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95)
    assert sampling._near_top(row, 0.7, 40, 0.95, 0.0) is not None
    assert_same_filtering(distribution(row, params), row, params)


def test_a_nucleus_reaching_below_the_cut_is_settled_near_the_top_only_by_min_p() -> None:
    # Three tokens near the top; the rest, tied just below the cut, hold ~1e-4 of the
    # mass, so a top_p of 1 - 1e-6 needs some of them.
    row = np.full(QWEN_VOCAB, 10.0 - sampling._NEAR_TOP_NATS - 0.01, dtype=np.float32)
    row[[5, 6, 7]] = [10.0, 9.0, 7.5]
    wide = 1.0 - 1e-6
    assert sampling._near_top(row, 1.0, 0, wide, 0.0) is None
    got = distribution(row, SamplingParams(temperature=1.0, top_p=wide))
    # Which of the tied tokens reach top_p is within rounding (each holds < 1e-9), so
    # only the shape of the answer is checked here.
    assert {5, 6, 7} < set(got.ids.tolist()) and got.ids.size < QWEN_VOCAB
    # min-p then drops every token below the cut, wherever the nucleus ends: exact.
    assert sampling._near_top(row, 1.0, 0, wide, 0.01) is not None
    params = SamplingParams(temperature=1.0, top_p=wide, min_p=0.01)
    got = distribution(row, params)
    np.testing.assert_array_equal(got.ids, [5, 6, 7])
    assert_same_filtering(got, row, params)


@pytest.mark.parametrize(
    "params",
    [*PEAKED_PARAMS, SamplingParams(temperature=1.0, top_k=3, top_p=0.5, min_p=0.2)],
    ids=["openai", "chat_defaults", "top_p_0.9", "top_k_top_p", "wide_with_min_p", "all_tight"],
)
def test_few_candidates_are_filtered_in_python_exactly_as_numpy_filters_them(
    params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Up to _PYTHON_CANDIDATES tokens near the top are filtered in plain Python; the
    # numpy code (the only path with the limit at 0) must give the same distribution:
    # tied runners-up, top-k sets smaller and larger than the candidates, nuclei of one
    # and of many tokens, and rows the near-top pass cannot settle.
    rng = np.random.default_rng(36)
    rows = [peaked_row(rng, gaps) for gaps in ([], [0.0], [0.5] * 6, [0.0, 0.0, 1.0, 5.0])]
    rows += [peaked_row(rng, sorted(rng.uniform(0.0, 12.0, size=size))) for size in (3, 30, 200)]
    rows += [llm_like_row(rng, peak) for peak in (9.0, 12.0)]
    settled = 0
    for row in rows:
        args = (row, params.temperature, params.top_k, params.top_p, params.min_p)
        in_python = sampling._near_top(*args)
        with monkeypatch.context() as numpy_only:
            numpy_only.setattr(sampling, "PYTHON_CANDIDATES", 0)
            in_numpy = sampling._near_top(*args)
        assert (in_python is None) == (in_numpy is None)
        if in_python is None or in_numpy is None:
            continue
        settled += 1
        # Which of the tokens tied at a top-k boundary are kept is a free choice, so
        # the kept logits are compared, and the probabilities in logit order.
        np.testing.assert_array_equal(np.sort(row[in_python.ids]), np.sort(row[in_numpy.ids]))
        np.testing.assert_allclose(np.sort(in_python.probs), np.sort(in_numpy.probs), rtol=1e-12)
        if not params.top_k:
            np.testing.assert_array_equal(in_python.ids, in_numpy.ids)
        if not near_a_threshold(row, params):
            assert_same_filtering(in_python, row, params)
    assert settled >= 6


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
