"""The accept/resample step is lossless: emitted tokens are distributed exactly like p.

Speculative sampling accepts a draft token x ~ q with probability min(1, p(x)/q(x))
and otherwise emits a token from normalize(max(p - q, 0)). The token emitted at each
position is then distributed as p, whatever q is; and because each position is exact
given the tokens before it, the joint distribution of a round's tokens is the
target's joint. These tests check that with samples, against exact p.

How sure a check is. For n iid samples from a distribution P with support size m,
the empirical distribution P_n satisfies

    E[TV(P_n, P)] <= 1/2 * sum_i sqrt(P_i (1 - P_i) / n) <= 1/2 * sqrt(m / n)

(Jensen per category, then Cauchy-Schwarz). TV(P_n, P) is a function of the n
samples that moves by at most 1/n when one sample changes, so McDiarmid gives
P(TV >= E[TV] + t) <= exp(-2 n t^2); t = sqrt(ln(1/delta) / (2n)) makes that delta.
So a correct sampler passes ``TV(P_n, P) <= tv_bound(n, m)`` except with probability
delta = 1e-6, with no asymptotic approximation. Seeds are fixed, so runs repeat.

The negative control emits the draft token every time (the mistake of trusting the
draft): the same check must fail wherever TV(q, p) is clearly above the bound.

Cost. The real ``verify_draft_token`` costs ~75 us on a rejection (it builds the
residual), too slow to run 100k times per case in a fast suite. So each case is
checked twice: a vectorised copy of the step (the same accept rule, and the real
``residual`` and ``distribution`` outputs) with N_REFERENCE samples proves the
algorithm with a tight bound, and the real function, sampled N_DIRECT times, must
pass the same check with the bound for its own n.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pytest

from backends.sampling.filters import SamplingParams, distribution
from backends.sampling.sparse_distribution import SparseDistribution
from backends.speculation import rejection
from backends.speculation.rejection import residual, verify_draft_token

VOCAB = 12
N_REFERENCE = 400_000
N_DIRECT = 12_000
FAILURE_PROBABILITY = 1e-6


def tv_bound(n: int, support: int, delta: float = FAILURE_PROBABILITY) -> float:
    """TV(empirical, true) stays below this except with probability delta (see top)."""
    return 0.5 * math.sqrt(support / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def total_variation(left: np.ndarray, right: np.ndarray) -> float:
    return 0.5 * float(np.abs(left - right).sum())


def dense(dist: SparseDistribution, size: int = VOCAB) -> np.ndarray:
    out = np.zeros(size)
    out[dist.ids] = dist.probs
    return out


def empirical(tokens: np.ndarray, size: int) -> np.ndarray:
    return np.bincount(tokens, minlength=size)[:size] / tokens.size


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def full(probs: np.ndarray) -> SparseDistribution:
    """A distribution over the whole small vocabulary (zeros dropped)."""
    ids = np.flatnonzero(probs > 0)
    return SparseDistribution(ids.astype(np.int64), probs[ids] / probs[ids].sum())


def draw(dist: SparseDistribution, n: int, rng: np.random.Generator) -> np.ndarray:
    """n iid tokens from ``dist``."""
    return rng.choice(dist.ids, size=n, p=dist.probs)


# -- one drafted position ---------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    p: SparseDistribution
    q: SparseDistribution


def _cases() -> list[Case]:
    rng = np.random.default_rng(20240601)
    logits_p = rng.normal(size=VOCAB) * 1.5
    logits_far = rng.normal(size=VOCAB) * 1.5
    p_full = full(softmax(logits_p))
    near = full(softmax(logits_p + rng.normal(size=VOCAB) * 0.15))
    far = full(softmax(logits_far))
    p_low = full(np.r_[softmax(logits_p[:6]), np.zeros(6)])
    q_high = full(np.r_[np.zeros(6), softmax(logits_far[6:])])
    nucleus = SamplingParams(temperature=1.0, top_p=0.8)
    return [
        Case("q_close_to_p", p_full, near),
        Case("q_far_from_p", p_full, far),
        Case("disjoint_supports", p_low, q_high),
        Case("one_hot_q_like_an_ngram_drafter", p_full, SparseDistribution.point(3)),
        Case(
            "top_p_applied_to_p_and_q",
            distribution(logits_p.astype(np.float32), nucleus),
            distribution(logits_far.astype(np.float32), nucleus),
        ),
        Case(
            "top_k_and_min_p_applied_to_p_and_q",
            distribution(logits_p, SamplingParams(temperature=1.3, top_k=7, min_p=0.05)),
            distribution(logits_far, SamplingParams(temperature=1.3, top_k=7, min_p=0.05)),
        ),
    ]


CASES = _cases()


def emit_with_reference_step(
    p: SparseDistribution,
    q: SparseDistribution,
    drafts: np.ndarray,
    rng: np.random.Generator,
    size: int = VOCAB,
) -> np.ndarray:
    """The accept/resample step, vectorised: accept x iff u * q(x) < p(x), else residual."""
    p_dense, q_dense = dense(p, size), dense(q, size)
    accept = rng.random(drafts.size) * q_dense[drafts] < p_dense[drafts]
    replacements = draw(residual(p, q), drafts.size, rng)
    return np.where(accept, drafts, replacements)


def emit_with_real_step(
    p: SparseDistribution, q: SparseDistribution, drafts: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """``verify_draft_token`` itself, once per drafted token."""
    emitted = []
    for draft in drafts.tolist():
        replacement = verify_draft_token(p, q, draft, rng)
        emitted.append(draft if replacement is None else replacement)
    return np.array(emitted, dtype=np.int64)


def test_the_cases_cover_what_they_claim() -> None:
    by_name = {case.name: case for case in CASES}
    for case in CASES:
        assert math.isclose(case.p.probs.sum(), 1.0) and math.isclose(case.q.probs.sum(), 1.0)
    assert total_variation(dense(by_name["q_close_to_p"].p), dense(by_name["q_close_to_p"].q)) < 0.1
    disjoint = by_name["disjoint_supports"]
    assert not set(disjoint.p.ids.tolist()) & set(disjoint.q.ids.tolist())
    truncated = by_name["top_p_applied_to_p_and_q"]
    assert 1 < truncated.p.ids.size < VOCAB and 1 < truncated.q.ids.size < VOCAB
    assert set(truncated.p.ids.tolist()) != set(truncated.q.ids.tolist())


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_reference_step_emits_tokens_distributed_as_p(case: Case) -> None:
    rng = np.random.default_rng(1)
    drafts = draw(case.q, N_REFERENCE, rng)
    emitted = emit_with_reference_step(case.p, case.q, drafts, rng)
    distance = total_variation(empirical(emitted, VOCAB), dense(case.p))
    assert distance <= tv_bound(N_REFERENCE, case.p.ids.size)


# The real function runs on the cases whose code paths differ: accept-mostly, reject
# always (disjoint), a point-mass q, and filtered p and q with different supports.
DIRECT_CASES = [
    case
    for case in CASES
    if case.name
    in {
        "q_close_to_p",
        "disjoint_supports",
        "one_hot_q_like_an_ngram_drafter",
        "top_p_applied_to_p_and_q",
    }
]


@functools.cache
def real_step_samples(case_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drafts x ~ q, what ``verify_draft_token`` emitted, and whether it accepted x."""
    case = next(case for case in CASES if case.name == case_name)
    rng = np.random.default_rng(2)
    drafts = draw(case.q, N_DIRECT, rng)
    emitted = np.empty(N_DIRECT, dtype=np.int64)
    accepted = np.empty(N_DIRECT, dtype=bool)
    for index, draft in enumerate(drafts.tolist()):
        replacement = verify_draft_token(case.p, case.q, draft, rng)
        accepted[index] = replacement is None
        emitted[index] = draft if replacement is None else replacement
    return drafts, emitted, accepted


@pytest.mark.parametrize("case", DIRECT_CASES, ids=lambda case: case.name)
def test_verify_draft_token_emits_tokens_distributed_as_p(case: Case) -> None:
    _, emitted, _ = real_step_samples(case.name)
    distance = total_variation(empirical(emitted, VOCAB), dense(case.p))
    assert distance <= tv_bound(N_DIRECT, case.p.ids.size)


@pytest.mark.parametrize("case", DIRECT_CASES, ids=lambda case: case.name)
def test_verify_draft_token_accepts_with_probability_min_one_p_over_q(case: Case) -> None:
    drafts, emitted, accepted = real_step_samples(case.name)
    p_dense, q_dense = dense(case.p), dense(case.q)
    expected_rate = float(np.sum(np.minimum(p_dense, q_dense)))  # = 1 - TV(p, q)
    # Hoeffding for one Bernoulli mean, failure probability 2e-6.
    assert abs(accepted.mean() - expected_rate) <= math.sqrt(math.log(1e6) / (2 * N_DIRECT))
    assert np.array_equal(emitted[accepted], drafts[accepted])
    for token in np.unique(drafts):
        if q_dense[token] <= p_dense[token]:
            assert accepted[drafts == token].all(), "p >= q: the draft token is always kept"
        if p_dense[token] == 0.0:
            assert not accepted[drafts == token].any(), "p = 0: the draft token is never kept"
    # A rejection never emits a token where q already has all of p's mass.
    rejected_emits = emitted[~accepted]
    assert np.all(p_dense[rejected_emits] > q_dense[rejected_emits])


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_residual_is_the_normalized_positive_part_of_p_minus_q(case: Case) -> None:
    excess = np.maximum(dense(case.p) - dense(case.q), 0.0)
    got = residual(case.p, case.q)
    assert np.all(np.diff(got.ids) > 0) and np.all(got.probs > 0)
    np.testing.assert_allclose(dense(got), excess / excess.sum(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("support", [3, 100, 300], ids=lambda size: f"{size}_tokens")
def test_residual_is_computed_alike_for_small_and_large_supports(
    support: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Supports up to _PYTHON_CANDIDATES tokens in all are done in Python, larger ones
    # with numpy: both must give normalize(max(p - q, 0)), overlapping or not.
    rng = np.random.default_rng(support)
    vocab = 4 * support

    def random_distribution() -> SparseDistribution:
        ids = np.sort(rng.choice(vocab, support, replace=False)).astype(np.int64)
        return SparseDistribution(ids, rng.dirichlet(np.full(support, 0.5)))

    p, q = random_distribution(), random_distribution()
    excess = np.maximum(dense(p, vocab) - dense(q, vocab), 0.0)
    both = []
    for limit in (rejection.PYTHON_CANDIDATES, 0):
        monkeypatch.setattr(rejection, "PYTHON_CANDIDATES", limit)
        got = residual(p, q)
        assert np.all(np.diff(got.ids) > 0) and np.all(got.probs > 0)
        np.testing.assert_allclose(dense(got, vocab), excess / excess.sum(), rtol=1e-12, atol=1e-15)
        both.append(got)
    np.testing.assert_array_equal(both[0].ids, both[1].ids)


def test_residual_of_identical_distributions_is_p() -> None:
    p = CASES[0].p
    got = residual(p, p)
    np.testing.assert_array_equal(got.ids, p.ids)
    np.testing.assert_array_equal(got.probs, p.probs)


CLEARLY_DIFFERENT = [
    case
    for case in CASES
    if total_variation(dense(case.p), dense(case.q)) > 3 * tv_bound(N_DIRECT, VOCAB)
]


def test_most_cases_are_clearly_different_enough_for_the_negative_control() -> None:
    assert len(CLEARLY_DIFFERENT) >= 4


@pytest.mark.parametrize("case", CLEARLY_DIFFERENT, ids=lambda case: case.name)
def test_negative_control_accepting_every_draft_fails_the_check(case: Case) -> None:
    rng = np.random.default_rng(4)
    for n in (N_REFERENCE, N_DIRECT):
        emitted = draw(case.q, n, rng)
        distance = total_variation(empirical(emitted, VOCAB), dense(case.p))
        assert distance > tv_bound(n, case.p.ids.size)


# -- two drafted positions: the joint distribution of a round -------------------------

M = 6  # tokens per position: joint outcomes are M * M


@dataclass(frozen=True)
class TwoStepCase:
    """p1, q1 for the first position; p2[a], q2[a] for the second, after token a."""

    name: str
    p1: SparseDistribution
    q1: SparseDistribution
    p2: tuple[SparseDistribution, ...]
    q2: tuple[SparseDistribution, ...]

    def target_joint(self) -> np.ndarray:
        joint = np.zeros((M, M))
        for first in range(M):
            joint[first] = dense(self.p1, M)[first] * dense(self.p2[first], M)
        return joint.ravel()

    def draft_joint(self) -> np.ndarray:
        joint = np.zeros((M, M))
        for first in range(M):
            joint[first] = dense(self.q1, M)[first] * dense(self.q2[first], M)
        return joint.ravel()


def _two_step_cases() -> list[TwoStepCase]:
    rng = np.random.default_rng(777)
    cases = []
    for name, noise, params in (
        ("q_close_to_p_with_top_p", 0.3, SamplingParams(temperature=0.9, top_p=0.9)),
        ("q_far_from_p", 2.0, SamplingParams(temperature=1.0)),
    ):
        target_first = rng.normal(size=M) * 1.5
        target_second = rng.normal(size=(M, M)) * 1.5
        draft_first = target_first + rng.normal(size=M) * noise
        draft_second = target_second + rng.normal(size=(M, M)) * noise
        cases.append(
            TwoStepCase(
                name,
                distribution(target_first, params),
                distribution(draft_first, params),
                tuple(distribution(row, params) for row in target_second),
                tuple(distribution(row, params) for row in draft_second),
            )
        )
    return cases


TWO_STEP_CASES = _two_step_cases()


def round_with_reference_step(
    case: TwoStepCase, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised round: the first position decided from x1 ~ q1, the second from a
    draft that follows the first *emitted* token (the same round's second draft when
    x1 was accepted, a fresh draft in the next round after a rejection)."""
    first = emit_with_reference_step(case.p1, case.q1, draw(case.q1, n, rng), rng, M)
    second = np.empty(n, dtype=np.int64)
    for token in range(M):
        where = first == token
        drafts = draw(case.q2[token], int(where.sum()), rng)
        second[where] = emit_with_reference_step(case.p2[token], case.q2[token], drafts, rng, M)
    return first, second


def round_with_real_step(
    case: TwoStepCase, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The same round, with ``verify_draft_token`` deciding every position."""
    first_out = np.empty(n, dtype=np.int64)
    second_out = np.empty(n, dtype=np.int64)
    for index, first_draft in enumerate(draw(case.q1, n, rng).tolist()):
        replacement = verify_draft_token(case.p1, case.q1, first_draft, rng)
        first = first_draft if replacement is None else replacement
        second_draft = case.q2[first].sample(rng)
        replacement = verify_draft_token(case.p2[first], case.q2[first], second_draft, rng)
        first_out[index] = first
        second_out[index] = second_draft if replacement is None else replacement
    return first_out, second_out


def test_two_step_cases_depend_on_the_first_token() -> None:
    for case in TWO_STEP_CASES:
        rows = {tuple(np.round(dense(p2, M), 6)) for p2 in case.p2}
        assert len(rows) == M


@pytest.mark.parametrize("case", TWO_STEP_CASES, ids=lambda case: case.name)
def test_reference_round_emits_two_tokens_with_the_target_joint(case: TwoStepCase) -> None:
    rng = np.random.default_rng(5)
    first, second = round_with_reference_step(case, N_REFERENCE, rng)
    joint = empirical(first * M + second, M * M)
    target = case.target_joint()
    assert total_variation(joint, target) <= tv_bound(N_REFERENCE, int((target > 0).sum()))


@pytest.mark.parametrize("case", TWO_STEP_CASES, ids=lambda case: case.name)
def test_verify_draft_token_round_emits_two_tokens_with_the_target_joint(
    case: TwoStepCase,
) -> None:
    rng = np.random.default_rng(6)
    first, second = round_with_real_step(case, N_DIRECT, rng)
    joint = empirical(first * M + second, M * M)
    target = case.target_joint()
    assert total_variation(joint, target) <= tv_bound(N_DIRECT, int((target > 0).sum()))


def test_negative_control_accepting_both_drafts_fails_the_joint_check() -> None:
    case = TWO_STEP_CASES[1]
    target = case.target_joint()
    support = int((target > 0).sum())
    assert total_variation(case.draft_joint(), target) > 3 * tv_bound(N_DIRECT, support)
    rng = np.random.default_rng(7)
    for n in (N_REFERENCE, N_DIRECT):
        outcomes = rng.choice(M * M, size=n, p=case.draft_joint())
        assert total_variation(empirical(outcomes, M * M), target) > tv_bound(n, support)
