"""The bound the distribution tests of drafters' ``q`` hold their samples to.

A drafter's draws must follow the ``q`` it reports, and the loop's accept/resample step
must then emit tokens that follow the target's ``p``; both are checked by the total
variation distance between the empirical distribution of the samples and the true one
(tests/speculation/test_sampling_lossless.py derives the bound).
"""

from __future__ import annotations

import math

import numpy as np

from backends.engine import Engine
from backends.sampling.filters import SamplingParams, distribution
from backends.sampling.sparse_distribution import SparseDistribution
from backends.speculation.rejection import verify_draft_token

FAILURE_PROBABILITY = 1e-6


def tv_bound(n: int, support: int) -> float:
    """TV(empirical, true) stays below this except with probability 1e-6."""
    return 0.5 * math.sqrt(support / n) + math.sqrt(math.log(1 / FAILURE_PROBABILITY) / (2 * n))


def empirical_tv(tokens: list[int], expected: SparseDistribution) -> float:
    """The total variation distance between ``tokens``' frequencies and ``expected``."""
    counts: dict[int, int] = {}
    for token in tokens:
        counts[token] = counts.get(token, 0) + 1
    ids = set(counts) | {int(token) for token in expected.ids}
    return 0.5 * sum(abs(counts.get(i, 0) / len(tokens) - expected.prob_of(i)) for i in ids)


def check_head_drafts_are_exact(
    engine: Engine,
    drafter_name: str,
    prompt: list[int],
    *,
    slot: int = 0,
    temperature: float,
    support: int,
    samples: int,
) -> tuple[float, float]:
    """A head's drafts at ``slot`` follow the ``q`` it reports, and (slot 0) the loop's
    accept step, ``min(1, p/q)`` else the residual, emits tokens that follow the
    target's ``p`` and accepts as often as exact rejection sampling does,
    ``sum(min(p, q))``. The negative control, drafts emitted unverified, misses ``p``
    by far more than the bound allows.

    The target reads ``prompt`` but its last token (the head's features end there),
    and ``p`` is its distribution after the whole prompt. Returns (slot 0) the rate at
    which drafts were accepted and llama.cpp's sample-and-match rate, ``sum(p * q)``.
    """
    target = engine.target
    drafter = engine.drafter_named(drafter_name)
    assert drafter is not None
    params = SamplingParams(temperature=temperature, top_k=support)
    target.rollback(0)
    target.prefill(prompt[:-1])
    p = distribution(np.array(target.forward(prompt[-1:])[0]), params)
    target.rollback(len(prompt) - 1)

    rng = np.random.default_rng(2024)
    drafts: list[int] = []
    q = None
    for _ in range(samples):
        proposal = drafter.propose(prompt, slot + 1, params, rng)
        assert proposal.distributions is not None
        if len(proposal.tokens) <= slot:
            continue  # ended early (an end-of-generation draft): the slot was not drawn
        drafted_q = proposal.distributions[slot]
        if q is None:
            q = drafted_q
        # Proposing again from the same context reads the same rows: the same q.
        assert np.array_equal(drafted_q.ids, q.ids) and np.allclose(drafted_q.probs, q.probs)
        drafts.append(proposal.tokens[slot])
    assert q is not None and len(drafts) > samples // 2
    bound = tv_bound(len(drafts), support)
    assert empirical_tv(drafts, q) <= bound
    if slot > 0:
        return 0.0, 0.0

    emitted, accepted = [], 0
    for draft in drafts:
        replacement = verify_draft_token(p, q, draft, rng)
        accepted += replacement is None
        emitted.append(draft if replacement is None else replacement)
    assert empirical_tv(emitted, p) <= bound

    overlap = sum(min(p.prob_of(int(token)), q.prob_of(int(token))) for token in q.ids)
    hoeffding = math.sqrt(math.log(2 / FAILURE_PROBABILITY) / (2 * len(drafts)))
    assert overlap > 2 * hoeffding  # the supports overlap: the accept branch is exercised
    assert abs(accepted / len(drafts) - overlap) <= hoeffding

    assert empirical_tv(drafts, p) > 2 * bound  # the negative control
    match = sum(p.prob_of(int(token)) * q.prob_of(int(token)) for token in q.ids)
    return accepted / len(drafts), match
