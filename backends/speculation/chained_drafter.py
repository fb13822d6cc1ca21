"""The free drafts first, a draft head fills the rest of the round (issue 54 part 4).

An n-gram match (the prompt, a tool call's text, the history index) costs microseconds
and is often long when the reply copies something; a head (the target's MTP head, an
EAGLE-3 or DFlash head) costs a forward but guesses anywhere. Chained, one round
drafts the match and then the head's continuation after it, so a copied stretch that
ends mid-round is followed by the head's guesses instead of a short round. (The
grammar's forced tokens come before both: ``round_drafts.py``.)

The head reads the match's tokens as it reads forced ones (after the target's cache,
``context[evaluated:]``), under the grammar and the reply's penalties moved past them.
Its ``q`` for the match's tokens is a point mass, the n-gram's own: the loop's
rejection sampling stays exact, each position judged against what proposed it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.output.constraints import GrammarState
from backends.sampling.filters import SamplingParams
from backends.sampling.penalties import TokenCounts
from backends.sampling.sparse_distribution import SparseDistribution
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.proposal import Drafter, DraftProposal
from backends.speculation.round_sampling import moved_past


class ChainedDrafter:
    """An n-gram drafter's match, then ``head``'s drafts after it (one round)."""

    FOLLOWS_GRAMMAR = True  # it moves the grammar past the match for the head

    def __init__(self, free: NgramDrafter, head: Drafter) -> None:
        self.free = free
        self.head = head
        self.name = chain_name(head.name)
        # How many of the last proposal's tokens were the match's (the controller
        # credits each part's acceptance to its own estimate).
        self.last_free_tokens = 0

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Nothing: both parts are the policy's drafters too, and begin as such."""

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        constraint: GrammarState | None = None,
        penalties: TokenCounts | None = None,
    ) -> DraftProposal:
        """The match (cut to what the grammar allows), then the head's drafts after it."""
        free = self.free.propose(context, max_tokens, params, rng).tokens[:max_tokens]
        if constraint is not None and free:
            free = free[: constraint.valid_prefix(free)]
        self.last_free_tokens = len(free)
        room = max_tokens - len(free)
        if room <= 0:
            return DraftProposal(tokens=free)
        with moved_past(free, constraint, penalties):
            kwargs = {}
            if getattr(self.head, "FOLLOWS_GRAMMAR", False):
                kwargs = {"constraint": constraint, "penalties": penalties}
            head = self.head.propose([*context, *free], room, params, rng, **kwargs)
        distributions = None
        if head.distributions is not None:
            points = [SparseDistribution.point(token) for token in free]
            distributions = points + head.distributions
        return DraftProposal(
            tokens=[*free, *head.tokens],
            distributions=distributions,
            top_probs=[1.0] * len(free) + list(head.top_probs),
            passes=head.passes,
            step_seconds=head.step_seconds,
            runtime_seconds=head.runtime_seconds,
        )


def chain_name(head: str) -> str:
    """The name a chain behind ``head`` goes by in decisions and statistics."""
    return f"ngram+{head}"
