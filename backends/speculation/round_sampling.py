"""What every round of a reply drafts and verifies under, as one value.

The sampling parameters, the reply's random generator, its grammar state and its
penalty counts travel together from the loop to the drafts (``round_drafts.py``,
``overlap.py``) and the verify (``verification.py``): the same four for p and q, so
speculation stays exact. The grammar state and the counts change as tokens are
committed; the value holding them does not.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from backends.output.constraints import GrammarState
from backends.sampling.filters import SamplingParams
from backends.sampling.penalties import TokenCounts


@dataclass(frozen=True)
class RoundSampling:
    """A reply's sampling inputs: ``params``, ``rng``, and where they apply, the
    grammar's ``constraint`` and the presence/frequency ``penalties``' counts."""

    params: SamplingParams
    rng: np.random.Generator
    constraint: GrammarState | None = None
    penalties: TokenCounts | None = None

    @property
    def greedy(self) -> bool:
        """Temperature 0: argmax on both sides, acceptance by equality."""
        return self.params.greedy

    @property
    def shapes_rows(self) -> bool:
        """Whether rows are masked or penalised before a token is chosen from them."""
        return self.constraint is not None or self.penalties is not None


@contextmanager
def moved_past(
    tokens: Sequence[int], constraint: GrammarState | None, penalties: TokenCounts | None
) -> Iterator[None]:
    """The grammar state and the penalty counts moved past ``tokens`` (drafts not yet
    verified: forced tokens, an n-gram's match) for the block, and back after it, so a
    drafter that follows them drafts from where those tokens leave the reply."""
    if tokens:
        if constraint is not None:
            constraint.consume(tokens)
        if penalties is not None:
            penalties.add(tokens)
    try:
        yield
    finally:
        if tokens:
            if constraint is not None:
                constraint.rollback(len(tokens))
            if penalties is not None:
                penalties.remove(tokens)
