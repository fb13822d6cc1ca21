"""What one of several sequences batched together decides with (SharedForwardCosts):
its forward rides with the others', so speculation must pay for the whole batch."""

from __future__ import annotations

from backends.speculation.acceptance import AcceptanceEstimate
from backends.speculation.controller import AdaptiveDraftPolicy
from backends.speculation.cost_model import CostModel, SharedForwardCosts
from backends.speculation.ngram_drafter import NgramDrafter
from tests.speculation.scripted_costs import (
    CPU_COSTS,
    GPU_COSTS,
    GPU_DRAFT_STEP,
    StubModelDrafter,
    _treat_stub_as_model_drafter,  # noqa: F401 - the fixture, used by these tests too
)


def test_a_forward_costs_what_the_whole_batch_does_and_batch_times_are_not_learned():
    costs = CostModel(dict(CPU_COSTS))
    sharing = [4]
    shared = SharedForwardCosts(costs, lambda: sharing[0])
    assert shared.verify(1) == costs.verify(4)
    assert shared.verify(4) == costs.verify(16)
    assert shared.verify_table(4)[1:] == [costs.verify(4 * n) for n in (1, 2, 3, 4)]
    before = shared.version
    shared.observe_verify(1, 9.0)  # a batch's time, not one sequence's
    assert costs.target_seconds[1] == CPU_COSTS[1]
    sharing[0] = 1
    assert shared.version != before and shared.verify(1) == costs.verify(1)
    for _ in range(5):  # alone again: learned, once most recent measurements say so
        shared.observe_verify(1, 0.050)
    assert costs.target_seconds[1] != CPU_COSTS[1]


def policy(costs: dict[int, float], sharing: int) -> AdaptiveDraftPolicy:
    estimates = {"model": AcceptanceEstimate(0.8)}
    estimates.update({f"ngram:{n}": AcceptanceEstimate(0.0) for n in (2, 3, 4)})
    shared = SharedForwardCosts(CostModel(dict(costs), GPU_DRAFT_STEP / 4), lambda: sharing)
    return AdaptiveDraftPolicy(
        [StubModelDrafter(), NgramDrafter()],
        shared,  # type: ignore[arg-type]
        acceptance=estimates,
    )


# A CPU where a few tokens cost little more than one, and more cost in proportion.
SMALL_BATCHES_CHEAP = {1: 0.040, 2: 0.045, 4: 0.060, 8: 0.120, 16: 0.240}


def test_four_sequences_on_a_compute_bound_cpu_decode_plainly_where_one_would_draft():
    alone, shared = policy(SMALL_BATCHES_CHEAP, 1), policy(SMALL_BATCHES_CHEAP, 4)
    for one in (alone, shared):
        one.begin([1, 2, 3])
    assert alone.plan([1, 2, 3]).draft_length > 0
    assert shared.plan([1, 2, 3]).draft_length == 0


def test_on_a_gpu_four_sequences_still_draft():
    shared = policy(GPU_COSTS, 4)
    shared.begin([1, 2, 3])
    plan = shared.plan([1, 2, 3])
    assert plan.drafter is not None and plan.drafter.name == "model" and plan.draft_length >= 2
