"""Peaked rows, the usual case: settled near the top without sorting the rest, exactly as
the full sort settles them (the near-top pass, the bound below the cut, few candidates
in Python).
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.sampling import filters as sampling
from backends.sampling import sparse_distribution
from backends.sampling.filters import SamplingParams, distribution
from tests.speculation.filter_reference import (
    QWEN_VOCAB,
    assert_same_filtering,
    llm_like_row,
    near_a_threshold,
    peaked_row,
    record_calls,
)

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
    assert sampling._near_top(row, int(row.argmax()), 0.7, 0, 0.95, 0.0) is None
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
    assert sampling._near_top(row, int(row.argmax()), 0.7, 40, params.top_p, 0.0) is None
    assert_same_filtering(distribution(row, params), row, params)
    # With top_p 0.95 the bound on the 38 below the cut settles it near the top.
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95)
    assert sampling._near_top(row, int(row.argmax()), 0.7, 40, 0.95, 0.0) is not None
    assert_same_filtering(distribution(row, params), row, params)


def test_a_nucleus_reaching_below_the_cut_is_settled_near_the_top_only_by_min_p() -> None:
    # Three tokens near the top; the rest, tied just below the cut, hold ~1e-4 of the
    # mass, so a top_p of 1 - 1e-6 needs some of them.
    row = np.full(QWEN_VOCAB, 10.0 - sampling._NEAR_TOP_NATS - 0.01, dtype=np.float32)
    row[[5, 6, 7]] = [10.0, 9.0, 7.5]
    wide = 1.0 - 1e-6
    assert sampling._near_top(row, int(row.argmax()), 1.0, 0, wide, 0.0) is None
    got = distribution(row, SamplingParams(temperature=1.0, top_p=wide))
    # Which of the tied tokens reach top_p is within rounding (each holds < 1e-9), so
    # only the shape of the answer is checked here.
    assert {5, 6, 7} < set(got.ids.tolist()) and got.ids.size < QWEN_VOCAB
    # min-p then drops every token below the cut, wherever the nucleus ends: exact.
    assert sampling._near_top(row, int(row.argmax()), 1.0, 0, wide, 0.01) is not None
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
        args = (
            row,
            int(row.argmax()),
            params.temperature,
            params.top_k,
            params.top_p,
            params.min_p,
        )
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
