"""Between the loop and whoever chooses each round's drafter and K.

A :class:`DraftPolicy` plans every round (:class:`RoundPlan`) and may learn from how
it went (:class:`RoundOutcome`); :class:`FixedDraftPolicy` is the baseline, the
adaptive one lives in ``backends/speculation/controller.py``; :class:`FirstRound`
keeps a policy's first round from waiting for a drafter to read the prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from backends.speculation.proposal import Drafter


@dataclass(frozen=True)
class RoundPlan:
    """What a policy chose for the next round."""

    drafter: Drafter | None
    draft_length: int
    estimated_speedup: float = 1.0
    reason: str = ""
    # The figures the policy decides with, corrected during this reply (cost_audit.py),
    # in words: "" when none was.
    costs_note: str = ""
    # Nodes a round may verify beyond ``draft_length`` as other continuations in the
    # same batch (a tree, draft_tree.py): 0 where a batch is not cheap.
    tree_nodes: int = 0


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

    Three declarations tell the loop how to treat it. ``LEARNS``: False, and it is not
    told about finished rounds (``observe`` is not called; describing one costs host
    time every round). ``FIRST_TOKEN_NEVER_WAITS``: True, and its first round is
    planned through :class:`FirstRound`. ``exact_batch_limit`` (exact output: the
    largest verify batch measured to round like one-token decoding; None: any): the
    loop keeps the grammar's forced tokens, and the guesses after them, within it.
    """

    LEARNS: bool
    FIRST_TOKEN_NEVER_WAITS: bool
    exact_batch_limit: int | None

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
    bounds only the rounds that verify the grammar's forced tokens. It drafts from the
    first round, whatever the drafter has read: its rounds, and so its random draws, do
    not depend on whether a draft model's cache is warm, so a seeded sampled reply is
    the same text beside other sequences as alone, and a fixed K measures what it says.
    Under ``auto`` the first token waits for no drafter (:class:`FirstRound`).
    """

    # It learns nothing from a round, so the loop need not describe one to it.
    LEARNS = False
    # Its rounds do not depend on what a drafter has read (see above).
    FIRST_TOKEN_NEVER_WAITS = False

    def __init__(
        self,
        drafter: Drafter | None,
        draft_length: int,
        exact_batch_limit: int | None = None,
        tree_nodes: int = 0,
    ) -> None:
        """``tree_nodes``: nodes each round may verify beside its K drafts as other
        continuations (a tree, where the drafter and the target offer them)."""
        self.drafter = drafter if draft_length > 0 else None
        self.draft_length = draft_length if drafter is not None else 0
        self.exact_batch_limit = exact_batch_limit
        self._plan = RoundPlan(self.drafter, self.draft_length, tree_nodes=tree_nodes)

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Tell the drafter a new generation starts."""
        if self.drafter is not None:
            self.drafter.begin(prompt_tokens)

    def plan(self, context: Sequence[int]) -> RoundPlan:
        """The fixed choice (one plan, made once)."""
        return self._plan

    def observe(self, outcome: RoundOutcome) -> None:
        """A fixed policy learns nothing."""


FIRST_ROUND_REASON = "first token: the target's own, from reading the prompt"


class FirstRound:
    """``policy`` for a reply's first round: its plan, made plain where the drafter
    would first have to read some of ``prompt_tokens`` (a draft model and a new prompt).

    The first token is the target's own, sampled from the row that reading the prompt
    ends on, and it is streamed at once: a draft model reading an agent's prompt first
    would hold it back a minute on a CPU, for drafts that save a round or two. The
    drafter reads in a later round, and only if that round drafts with it (``auto``
    charges the reading to that choice), so a reply that ends at its first token never
    pays for it. Drafters with nothing to read (n-gram lookup, a prediction, the MTP
    head, a draft model whose kept state holds the whole prompt) draft as planned.
    The loop uses it for policies that set ``FIRST_TOKEN_NEVER_WAITS`` (``auto``).
    """

    FIRST_TOKEN_NEVER_WAITS = False  # it is the first round's planner itself

    def __init__(self, policy: DraftPolicy, prompt_tokens: Sequence[int]) -> None:
        self.policy = policy
        self.prompt_tokens = prompt_tokens
        self.LEARNS = policy.LEARNS
        self.exact_batch_limit = policy.exact_batch_limit

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Pass on."""
        self.policy.begin(prompt_tokens)

    def plan(self, context: Sequence[int]) -> RoundPlan:
        """The policy's plan, plain where its drafter has some of the prompt to read.

        The pending token (the prompt's last) and a grammar's forced tokens after it
        are read by any round's first draft step: they do not count.
        """
        plan = self.policy.plan(context)
        unread = getattr(plan.drafter, "unread", None)
        if plan.drafter is None or unread is None or unread(self.prompt_tokens) == 0:
            return plan
        return dataclasses.replace(
            plan, drafter=None, draft_length=0, estimated_speedup=1.0, reason=FIRST_ROUND_REASON
        )

    def observe(self, outcome: RoundOutcome) -> None:
        """Pass on."""
        self.policy.observe(outcome)
