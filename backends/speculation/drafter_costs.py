"""What drafting costs, drafter by drafter, as the controller prices a round: the draft
model and a chain head (MTP, EAGLE-3) cost a step per drafted token; a block head
(DFlash, DSpark) one forward per round, whatever the round drafts; n-gram lookups and
predictions nothing worth pricing. Steps and blocks are measured while they draft
(``CostModel.draft_step_seconds``, ``CostModel.head_step_seconds`` by the drafter's
name); until then a prior stands in, as a share of a one-token target forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.speculation.block_drafter import BlockDrafter
from backends.speculation.chained_drafter import ChainedDrafter
from backends.speculation.cost_model import CostModel
from backends.speculation.model_drafter import ModelDrafter

# A chain head's step before one is measured: one decoder block and the LM head (~6%
# of a 27B model's step, half of a tiny model's).
HEAD_STEP_PRIOR = 0.2
# A block head's forward before one is measured: a few decoder layers over the block
# and the LM head over each slot.
BLOCK_PRIOR = 0.5


@dataclass(frozen=True)
class DraftCost:
    """Seconds a round's drafts cost: ``per_token`` for each drafted token, plus
    ``per_round`` once where the round drafts at all."""

    per_token: float
    per_round: float = 0.0


def draft_cost(name: str, drafter: object, costs: CostModel) -> DraftCost:
    """What drafting with ``drafter`` (called ``name``) costs on these figures."""
    plain = costs.verify(1)
    if isinstance(drafter, ModelDrafter):
        step = costs.draft_step_seconds
        return DraftCost(step if step is not None else plain)
    if isinstance(drafter, BlockDrafter):
        block = costs.head_step_seconds.get(name)
        return DraftCost(0.0, block if block is not None else BLOCK_PRIOR * plain)
    if is_head(drafter):
        step = costs.head_step_seconds.get(name)
        return DraftCost(step if step is not None else HEAD_STEP_PRIOR * plain)
    return DraftCost(0.0)


def is_head(drafter: object) -> bool:
    """Is ``drafter`` a head's (MTP, EAGLE-3, DFlash: its steps are a runtime's forwards)?"""
    return getattr(drafter, "head", None) is not None and not isinstance(drafter, ChainedDrafter)


def longest_draft(drafter: object, max_tokens: int) -> int:
    """The most tokens ``drafter`` drafts in a round of at most ``max_tokens`` (a block
    head no more than its block)."""
    if isinstance(drafter, BlockDrafter):
        return min(max_tokens, drafter.head.max_drafts)
    return max_tokens


def break_even_acceptance(costs: CostModel, draft_tokens: int, cost: DraftCost) -> float:
    """Acceptance at which one more drafted token pays for itself.

    It costs a draft step plus its share of the verify batch, and brings a token that
    would otherwise cost a plain step.
    """
    plain = costs.verify(1)
    marginal_verify = (costs.verify(draft_tokens + 1) - plain) / max(1, draft_tokens)
    step = cost.per_token or plain
    return min(0.95, max(0.05, (step + marginal_verify) / plain))
