"""One round's drafts: the grammar's forced tokens, then the drafter's guesses.

The loop (``loop.py``) asks for them once a round, through ``overlap.py``'s
``round_steps``: this function itself, except where the next round is drafted during a
split target's verify (no grammar there, so no forced tokens).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from backends.output.constraints import GrammarState
from backends.sampling.filters import SamplingParams
from backends.sampling.penalties import TokenCounts
from backends.sampling.sparse_distribution import SparseDistribution
from backends.speculation.draft_policy import DraftPolicy, RoundPlan
from backends.speculation.proposal import EMPTY_PROPOSAL, DraftProposal


def round_drafts(
    policy: DraftPolicy,
    context: list[int],
    forced: list[int],
    room: int,
    params: SamplingParams,
    rng: np.random.Generator,
    constraint: GrammarState | None,
    penalties: TokenCounts | None,
) -> tuple[RoundPlan, list[int], DraftProposal]:
    """This round's plan and drafts: the grammar's forced tokens, then the drafter's.

    The policy plans, and its drafter drafts, from the context after the forced
    tokens (the grammar state and the penalty counts are moved past them meanwhile,
    and back), so one verify checks both: the free stretch and the guesses after it.
    ``room`` bounds the whole batch of drafts. The proposal's distributions (q) are
    aligned with the drafts: a point mass for each forced token.
    """
    after = [*context, *forced] if forced else context
    if forced:
        assert constraint is not None
        constraint.consume(forced)
        if penalties is not None:
            penalties.add(forced)
    try:
        plan = policy.plan(after)
        length = max(0, min(plan.draft_length, room - len(forced)))
        proposal = EMPTY_PROPOSAL
        if plan.drafter is not None and length > 0:
            shaped = constraint is not None or penalties is not None
            if shaped and getattr(plan.drafter, "FOLLOWS_GRAMMAR", False):
                proposal = plan.drafter.propose(
                    after, length, params, rng, constraint=constraint, penalties=penalties
                )
            else:
                proposal = plan.drafter.propose(after, length, params, rng)
        guesses = proposal.tokens[:length]
        if constraint is not None and guesses:
            # A draft the grammar refuses would be rejected anyway; not verifying it
            # keeps the masks below defined.
            guesses = guesses[: constraint.valid_prefix(guesses)]
    finally:
        if forced:
            assert constraint is not None
            constraint.rollback(len(forced))
            if penalties is not None:
                penalties.remove(forced)
    if not forced:
        return plan, guesses, proposal
    distributions = None
    if proposal.distributions is not None:
        points = [SparseDistribution.point(token) for token in forced]
        distributions = points + proposal.distributions[: len(guesses)]
    combined = dataclasses.replace(
        proposal, tokens=[*forced, *guesses], distributions=distributions
    )
    return plan, [*forced, *guesses], combined
