"""Drafting the next round while a split target verifies this one ("speculative
speculative decoding", issue 38).

With the target's layers on workers, every verify waits on the network while the draft
model, on this machine, is idle. So the verify's forward runs on a helper thread, and
meanwhile this thread drafts the next round for the likeliest outcome: every draft
accepted and the bonus token the draft model's own guess for it. The draft model reads
``context + drafts`` (its argmax there is the guess ``g``) and chains on: ``g, n1 .. nK``.
When the verify accepts every draft and its bonus token is ``g``, the next round's
context is exactly ``context + drafts + g`` and ``n1 .. nK`` are that round's drafts,
already made; otherwise they are dropped, and the draft model's cache, which follows the
context lazily (``ModelDrafter.propose`` cuts it back to the longest prefix it shares
with the context), forgets them on its next proposal: a discarded pre-draft costs only
its time, which was spent during the wait. The target still verifies every token, so
the output is what it is without the overlap.

When it runs (the engine asks for it only with a split target and one sequence at a
time, ``backends/engine.py``): greedy decoding, no grammar and no presence or
frequency penalties (their masks and counts would have to be carried to the next round
and back), and only in rounds whose drafter is the draft model (n-gram drafts cost
nothing to make; the MTP head runs on the target's own context). Under ``auto`` the
next round is still planned after this one is observed: the pre-draft serves if that
plan picks the draft model again with no more tokens than were pre-drafted (cut to the
plan's length, and where the confidence floor moved up, to the floor), else it is
dropped.

Threads: the verify runs on one helper thread (one per process), inside
:func:`~backends.runtime_exchange.computing_beside`, so llama.cpp computes its local
part there on that thread alone and starts no second OpenMP team; the draft model
computes on the loop's own thread (the engine's runtime thread) as always.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from backends.base import Model
from backends.generation_events import StatsAccumulator
from backends.runtime_exchange import computing_beside
from backends.sampling.rows import LogitRows, forward_rows
from backends.speculation.draft_policy import DraftPolicy, RoundPlan
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.proposal import EMPTY_PROPOSAL, DraftProposal
from backends.speculation.round_drafts import round_drafts
from backends.speculation.round_sampling import RoundSampling

DraftRound = Callable[
    [
        DraftPolicy,
        list[int],
        list[int],
        int,
        RoundSampling,
    ],
    tuple[RoundPlan, list[int], DraftProposal],
]
VerifyForward = Callable[[Model, Sequence[int]], LogitRows]


def round_steps(
    overlap: bool, sampling: RoundSampling, stats: StatsAccumulator
) -> tuple[DraftRound, VerifyForward]:
    """The loop's two steps of a round: making its drafts, and the verify's forward.

    Without ``overlap`` (or where it does not apply) they are the plain ones, called as
    they always were; with it, both go through one :class:`OverlapDrafting`.
    """
    if not overlap or not sampling.greedy or sampling.shapes_rows:
        return round_drafts, forward_rows
    drafting = OverlapDrafting(stats)
    return drafting.draft, drafting.forward


@dataclass(frozen=True)
class _Ahead:
    """What to draft during the coming verify: after ``context`` (which ends with the
    round's drafts), the guess and ``length`` tokens more."""

    drafter: ModelDrafter
    context: list[int]
    length: int
    sampling: RoundSampling


@dataclass(frozen=True)
class _PreDraft:
    """A next round drafted during a verify: it serves a context ``expected``."""

    model: Model
    expected: list[int]  # the context the guess holding would give
    length: int  # tokens asked for (``tokens`` may be fewer: an end token, the floor)
    tokens: list[int]
    top_probs: list[float]
    step_seconds: float | None


class OverlapDrafting:
    """Drafts each round's successor during its verify, and uses it when the guess holds.

    Counts the rounds pre-drafted and the pre-drafts used in ``stats``.
    """

    def __init__(self, stats: StatsAccumulator) -> None:
        self.stats = stats
        self._ahead: _Ahead | None = None  # to draft during the coming verify
        self._ready: _PreDraft | None = None  # drafted during the last verify
        # Drafts beside the verify with no floor of its own, recording its confidences,
        # so the floor the next round's plan sets can be applied then.
        self._drafters: dict[int, ModelDrafter] = {}

    def draft(
        self,
        policy: DraftPolicy,
        context: list[int],
        forced: list[int],
        room: int,
        sampling: RoundSampling,
    ) -> tuple[RoundPlan, list[int], DraftProposal]:
        """This round's plan and drafts (as :func:`round_drafts`), from the pre-draft
        where the guess held and the plan wants no more of the draft model than it has."""
        assert not forced, "no grammar where rounds overlap (round_steps): nothing forced"
        ready, self._ready = self._ready, None
        self._ahead = None
        plan = policy.plan(context)
        length = max(0, min(plan.draft_length, room))
        drafter = plan.drafter
        if drafter is None or length == 0:
            return plan, [], EMPTY_PROPOSAL
        if not isinstance(drafter, ModelDrafter):
            proposal = drafter.propose(context, length, sampling.params, sampling.rng)
            return plan, proposal.tokens[:length], proposal
        proposal = _serving(ready, drafter, context, length)
        if proposal is not None:
            self.stats.predrafts_used += 1
        else:
            proposal = drafter.propose(context, length, sampling.params, sampling.rng)
        drafts = proposal.tokens[:length]
        model = drafter.model
        # The draft model reads the drafts, the guess and ``length`` more: all must fit.
        if drafts and len(context) + 2 * len(drafts) + 2 <= model.n_ctx:
            self._ahead = _Ahead(self._beside(model), [*context, *drafts], length, sampling)
        return plan, drafts, proposal

    def forward(self, target: Model, tokens: Sequence[int]) -> LogitRows:
        """The verify's forward of ``tokens``; on the helper thread while this one drafts
        the next round, where this round planned to."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return forward_rows(target, tokens)
        verify = _verifier().submit(_forward_beside, target, tokens)
        try:
            sampling = ahead.sampling
            chain = ahead.drafter.propose(
                ahead.context, ahead.length + 1, sampling.params, sampling.rng
            )
        finally:
            # Never leave the target computing: its result (or error) is waited for first.
            rows = verify.result()
        self.stats.draft_passes += chain.passes
        if len(chain.tokens) > 1:
            self.stats.predrafted_rounds += 1
            self._ready = _PreDraft(
                model=ahead.drafter.model,
                expected=[*ahead.context, chain.tokens[0]],
                length=ahead.length,
                tokens=chain.tokens[1:],
                top_probs=chain.top_probs[1:],
                step_seconds=chain.step_seconds,
            )
        return rows

    def _beside(self, model: Model) -> ModelDrafter:
        drafter = self._drafters.get(id(model))
        if drafter is None:
            drafter = ModelDrafter(model, record_confidence=True)
            self._drafters[id(model)] = drafter
        return drafter


def _serving(
    ready: _PreDraft | None, drafter: ModelDrafter, context: list[int], length: int
) -> DraftProposal | None:
    """The pre-draft as this round's proposal, cut to ``length`` and to the drafter's
    floor; None where it does not serve (the guess failed, another model, too short)."""
    if ready is None or ready.model is not drafter.model or length > ready.length:
        return None
    # The context grows only by what the verify committed: as long as the one the guess
    # holding gives means every draft was accepted, and then its last token is the bonus.
    if len(context) != len(ready.expected) or context[-1] != ready.expected[-1]:
        return None
    tokens, top_probs = ready.tokens[:length], ready.top_probs[:length]
    floor = drafter.min_confidence
    if floor > 0:
        # As the drafter would stop now: never before its first token.
        kept = next((i for i, p in enumerate(top_probs) if i > 0 and p < floor), len(tokens))
        tokens, top_probs = tokens[:kept], top_probs[:kept]
    if not tokens:
        return None
    # Made and timed during the last verify: no passes or runtime in this round.
    return dataclasses.replace(
        EMPTY_PROPOSAL, tokens=tokens, top_probs=top_probs, step_seconds=ready.step_seconds
    )


def _forward_beside(target: Model, tokens: Sequence[int]) -> LogitRows:
    with computing_beside():
        return forward_rows(target, tokens)


_verifier_lock = threading.Lock()
_verifier_pool: ThreadPoolExecutor | None = None


def _verifier() -> ThreadPoolExecutor:
    """The one helper thread that runs verifies beside drafting (made on first use)."""
    global _verifier_pool
    with _verifier_lock:
        if _verifier_pool is None:
            _verifier_pool = ThreadPoolExecutor(1, thread_name_prefix="draftpen-verify")
        return _verifier_pool
