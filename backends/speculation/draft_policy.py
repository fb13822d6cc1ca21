"""Between the loop and whoever chooses each round's drafter and K.

A :class:`DraftPolicy` plans every round (:class:`RoundPlan`) and may learn from how
it went (:class:`RoundOutcome`); :class:`FixedDraftPolicy` is the baseline, the
adaptive one lives in ``backends/speculation/controller.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from backends.speculation.drafters import Drafter


@dataclass(frozen=True)
class RoundPlan:
    """What a policy chose for the next round."""

    drafter: Drafter | None
    draft_length: int
    estimated_speedup: float = 1.0
    reason: str = ""


@dataclass(frozen=True)
class RoundOutcome:
    """What happened in a round, for a policy to learn from."""

    drafter: str
    drafted: int
    accepted: int
    verify_seconds: float
    emitted: int
    # The drafter's own confidence in each drafted token, where it reports one.
    draft_confidences: tuple[float, ...] = ()
    # Mean time of a one-token draft-model step this round (None: none was timed).
    draft_step_seconds: float | None = None
    # Tokens verified in the batch besides the pending one and ``drafted``: the
    # grammar's forced tokens (and guesses that were not judged). The batch held
    # ``1 + drafted + other_verified`` tokens.
    other_verified: int = 0


class DraftPolicy(Protocol):
    """Chooses the drafter and draft length for each round.

    A policy whose class sets ``LEARNS = False`` is not told about finished rounds
    (``observe`` is not called): describing one costs host time every round. A policy
    with an ``exact_batch_limit`` (exact output: the largest verify batch measured to
    round like one-token decoding) has the loop keep the grammar's forced tokens, and
    the guesses after them, within it.
    """

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """A new generation starts."""
        ...

    def plan(self, context: Sequence[int]) -> RoundPlan:
        """The drafter and K for the next round (K = 0: plain decoding)."""
        ...

    def observe(self, outcome: RoundOutcome) -> None:
        """Learn from a finished round."""
        ...


class FixedDraftPolicy:
    """Always the same drafter and K (K = 0 or no drafter: plain decoding).

    K is verified as asked; ``exact_batch_limit`` (exact output, where it was measured)
    bounds only the rounds that verify the grammar's forced tokens.
    """

    # It learns nothing from a round, so the loop need not describe one to it.
    LEARNS = False

    def __init__(
        self, drafter: Drafter | None, draft_length: int, exact_batch_limit: int | None = None
    ) -> None:
        self.drafter = drafter if draft_length > 0 else None
        self.draft_length = draft_length if drafter is not None else 0
        self.exact_batch_limit = exact_batch_limit
        self._plan = RoundPlan(self.drafter, self.draft_length)

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Tell the drafter a new generation starts."""
        if self.drafter is not None:
            self.drafter.begin(prompt_tokens)

    def plan(self, context: Sequence[int]) -> RoundPlan:
        """The fixed choice (one plan, made once)."""
        return self._plan

    def observe(self, outcome: RoundOutcome) -> None:
        """A fixed policy learns nothing."""
