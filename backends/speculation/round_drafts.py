"""One round's drafts: the grammar's forced tokens, then the drafter's guesses.

The loop (``loop.py``) asks for them once a round, through ``overlap.py``'s
``round_steps``: this function itself, except where the next round is drafted during a
split target's verify (no grammar there, so no forced tokens).
"""

from __future__ import annotations

import dataclasses

from backends.sampling.sparse_distribution import SparseDistribution
from backends.speculation.draft_policy import DraftPolicy, RoundPlan
from backends.speculation.proposal import EMPTY_PROPOSAL, Drafter, DraftProposal
from backends.speculation.round_sampling import RoundSampling, moved_past


def round_drafts(
    policy: DraftPolicy,
    context: list[int],
    forced: list[int],
    room: int,
    sampling: RoundSampling,
) -> tuple[RoundPlan, list[int], DraftProposal]:
    """This round's plan and drafts: the grammar's forced tokens, then the drafter's.

    The policy plans, and its drafter drafts, from the context after the forced
    tokens (the grammar state and the penalty counts are moved past them meanwhile,
    and back), so one verify checks both: the free stretch and the guesses after it.
    ``room`` bounds the whole batch of drafts. The proposal's distributions (q) are
    aligned with the drafts: a point mass for each forced token.
    """
    constraint, penalties = sampling.constraint, sampling.penalties
    after = [*context, *forced] if forced else context
    # Only a grammar forces tokens.
    assert not forced or constraint is not None
    with moved_past(forced, constraint, penalties):
        plan = policy.plan(after)
        length = max(0, min(plan.draft_length, room - len(forced)))
        proposal = EMPTY_PROPOSAL
        if plan.drafter is not None and length > 0:
            proposal = _propose(plan.drafter, after, length, sampling)
        guesses = proposal.tokens[:length]
        if constraint is not None and guesses:
            # A draft the grammar refuses would be rejected anyway; not verifying it
            # keeps the masks below defined.
            guesses = guesses[: constraint.valid_prefix(guesses)]
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


def _propose(
    drafter: Drafter, context: list[int], length: int, sampling: RoundSampling
) -> DraftProposal:
    """The drafter's proposal, drafted under the grammar and the penalties where it
    follows them (``FOLLOWS_GRAMMAR``); other drafters' guesses are cut to the grammar
    by the caller and need no penalties (their q is a point mass)."""
    if sampling.shapes_rows and getattr(drafter, "FOLLOWS_GRAMMAR", False):
        return drafter.propose(
            context,
            length,
            sampling.params,
            sampling.rng,
            constraint=sampling.constraint,
            penalties=sampling.penalties,
        )
    return drafter.propose(context, length, sampling.params, sampling.rng)
