"""Whether a round verifies a tree of continuations, and its forward (issue 55 part 4).

The loop (``loop.py``) asks :func:`round_tree` once a round, after drafting: a tree is
made only where every condition for it holds, and otherwise the round verifies its
single best continuation as always:

- the policy allows extra nodes (``RoundPlan.tree_nodes``: under ``auto`` only where the
  calibrated forward costs say a larger batch costs about what the chain's does);
- the drafter offered other continuations (one-hot: the n-gram drafter's index lookup);
- the target verifies trees (``VerifiesTrees``: llama.cpp with one sequence and a KV
  cache; not a recurrent state, not several sequences, not MLX);
- no grammar and no forced tokens this round (their masks follow one chain).

Under exact kernels the whole batch stays within the exact batch limit, so every row is
computed as one-token decoding would compute it.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.base import DraftTree, Model, tree_branches
from backends.sampling.rows import HostRows, LogitRows
from backends.speculation.cost_model import CostModel
from backends.speculation.draft_policy import RoundPlan
from backends.speculation.draft_tree import build_tree
from backends.speculation.proposal import DraftProposal
from backends.speculation.round_sampling import RoundSampling

# A batch is "cheap" for a tree when its extra nodes add at most this share to the
# forward's calibrated time (a GPU's or Apple Silicon's few-token forwards cost about
# one decode; 2 CPU cores pay ~30% more for each token more, so they never make trees).
TREE_COST_MARGIN = 0.15
# Fewer extra nodes than this are not worth a tree; more than this are never asked for.
MIN_TREE_NODES = 2
MAX_TREE_NODES = 16


def tree_room(costs: CostModel, draft_tokens: int, exact_batch_limit: int | None) -> int:
    """How many nodes ``auto`` lets a round verify beside its ``draft_tokens`` drafts:
    as many as keep the forward within :data:`TREE_COST_MARGIN` of the chain's, by the
    calibrated costs per batch size (0: a tree does not pay here)."""
    chain = 1 + draft_tokens
    ceiling = costs.verify(chain) * (1.0 + TREE_COST_MARGIN)
    extra = 0
    while extra < MAX_TREE_NODES and costs.verify(chain + extra + 1) <= ceiling:
        extra += 1
    if exact_batch_limit is not None:
        extra = min(extra, exact_batch_limit - chain)
    return extra if extra >= MIN_TREE_NODES else 0


def round_tree(
    target: Model,
    plan: RoundPlan,
    drafts: Sequence[int],
    forced: Sequence[int],
    proposal: DraftProposal,
    sampling: RoundSampling,
    exact_batch_limit: int | None,
) -> DraftTree | None:
    """The tree this round verifies, or None: verify ``drafts`` as a chain."""
    if plan.tree_nodes <= 0 or not proposal.alternatives or not drafts or forced:
        return None
    if sampling.constraint is not None or proposal.distributions is not None:
        return None
    width = tree_branches(target)
    if width < 2:
        return None
    max_nodes = len(drafts) + plan.tree_nodes
    if exact_batch_limit is not None:
        max_nodes = min(max_nodes, exact_batch_limit - 1)
    if max_nodes <= len(drafts):
        return None  # no room beside the best continuation
    # No branch goes deeper than the best one: the round's depth (and a recurrent
    # state's or the context's room) was chosen for it.
    branches = [list(drafts), *(list(b[: len(drafts)]) for b in proposal.alternatives)]
    return build_tree(branches[:width], max_nodes)


def tree_rows(target: Model, pending: int, tree: DraftTree) -> LogitRows:
    """The rows of one forward of ``pending`` and the tree's nodes (row 0: pending)."""
    return HostRows(target.forward_tree(pending, tree))  # type: ignore[attr-defined]
