"""What a drafter proposes, and the protocol every drafter follows.

A drafter looks at the committed context (prompt + accepted output, ending with the
token the target will evaluate next) and proposes up to ``max_tokens`` continuation
tokens, each with the distribution ``q`` it was drawn from. The drafters, one a file:
:mod:`~backends.speculation.model_drafter` (a small model sharing the target's
tokenizer), :mod:`~backends.speculation.ngram_drafter` (prompt lookup),
:mod:`~backends.speculation.prediction_drafter` (the caller's prediction of the output)
and :mod:`~backends.speculation.mtp_drafter` (the target's own multi-token heads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from backends.sampling.filters import SamplingParams
from backends.sampling.sparse_distribution import SparseDistribution


@dataclass(frozen=True)
class DraftProposal:
    """Draft tokens and, for sampled drafts, the distribution each was drawn from.

    ``distributions`` is None when every token is a point mass (n-gram, prediction,
    or a model drafting greedily); the loop then treats each ``q`` as one-hot.
    ``top_probs`` holds the drafter's own confidence in each token where it has one.
    ``step_seconds`` is the mean time of the one-token forwards a model drafter made;
    a first forward that caught its cache up on several tokens is left out of it.
    ``runtime_seconds`` is all the time spent inside the draft model's forward and
    rollback calls (catch-up included), so the loop can tell host time from runtime.
    ``alternatives`` are other likely continuations of the same context (one-hot, the
    likelier first; only where ``distributions`` is None): the loop may verify them
    with ``tokens`` as one tree (``draft_tree.py``).
    """

    tokens: list[int]
    distributions: list[SparseDistribution] | None = None
    top_probs: list[float] = field(default_factory=list)
    passes: int = 0
    step_seconds: float | None = None
    runtime_seconds: float = 0.0
    alternatives: tuple[tuple[int, ...], ...] = ()


EMPTY_PROPOSAL = DraftProposal(tokens=[])


class Drafter(Protocol):
    """Anything that proposes draft tokens."""

    name: str

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Start a new generation whose context begins with ``prompt_tokens``."""
        ...

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> DraftProposal:
        """Up to ``max_tokens`` tokens that may follow ``context``."""
        ...
