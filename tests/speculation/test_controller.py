"""The adaptive draft policy, driven by scripted costs and acceptance (no timing)."""

from __future__ import annotations

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.sampling.filters import SamplingParams
from backends.speculation.acceptance import AcceptanceEstimate, ConfidenceFloor
from backends.speculation.controller import MODEL_PROBE_INTERVAL, AdaptiveDraftPolicy
from backends.speculation.cost_model import CostModel
from backends.speculation.draft_policy import RoundOutcome
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from tests.speculation.scripted_costs import (
    CPU_COSTS,
    GPU_COSTS,
    GPU_DRAFT_STEP,
    StubModelDrafter,
    _treat_stub_as_model_drafter,  # noqa: F401  (a fixture)
)
from tests.support.fakes import HashModel, draft_model_for

CPU_DRAFT_STEP = 0.023


def policy_with(costs: dict[int, float], draft_step: float, acceptance: float):
    estimates = {"model": AcceptanceEstimate(acceptance)}
    estimates.update({f"ngram:{n}": AcceptanceEstimate(0.0) for n in (2, 3, 4)})
    return AdaptiveDraftPolicy(
        [StubModelDrafter(), NgramDrafter()],
        CostModel(dict(costs), draft_step),
        acceptance=estimates,
    )


def test_draft_model_is_turned_off_when_its_cost_makes_speculation_lose():
    policy = policy_with(CPU_COSTS, CPU_DRAFT_STEP, acceptance=0.97)
    policy.begin([1, 2, 3])
    plan = policy.plan([1, 2, 3])
    assert plan.draft_length == 0 and plan.drafter is None
    assert "draft model too slow" in plan.reason


def test_draft_model_is_used_with_several_tokens_where_verification_is_cheap():
    policy = policy_with(GPU_COSTS, GPU_DRAFT_STEP, acceptance=0.8)
    policy.begin([1, 2, 3])
    plan = policy.plan([1, 2, 3])
    assert plan.drafter is not None and plan.drafter.name == "model"
    assert plan.draft_length >= 3
    assert plan.estimated_speedup > 1.5


def test_low_acceptance_turns_the_draft_model_off_even_on_a_gpu():
    policy = policy_with(GPU_COSTS, GPU_DRAFT_STEP, acceptance=0.05)
    policy.begin([1, 2, 3])
    assert policy.plan([1, 2, 3]).draft_length == 0


def test_observed_rejections_lower_acceptance_and_then_k():
    policy = policy_with(GPU_COSTS, GPU_DRAFT_STEP, acceptance=0.9)
    policy.begin([1])
    first = policy.plan([1]).draft_length
    for _ in range(40):
        policy.observe(
            RoundOutcome("model", 8, 0, GPU_COSTS[8], 1, draft_step_seconds=GPU_DRAFT_STEP)
        )
    assert policy.acceptance["model"].at(0) < 0.1
    assert policy.plan([1]).draft_length < first


def test_long_verbatim_runs_pay_on_cpu_but_short_drafts_do_not():
    costs = CostModel(dict(CPU_COSTS))
    always_right = AcceptanceEstimate(1.0)
    rate = {k: always_right.expected_tokens(k) / costs.verify(k + 1) for k in (1, 3, 15)}
    plain = 1 / costs.verify(1)
    assert rate[1] / plain < 1.1
    assert rate[15] / plain > 1.4


def test_shadowed_ngram_brings_speculation_back_when_text_turns_repetitive():
    """While plain decoding runs, the n-gram drafter's proposals are scored for free."""
    policy = policy_with(CPU_COSTS, CPU_DRAFT_STEP, acceptance=0.0)
    policy.params = SamplingParams()
    rng = np.random.default_rng(0)
    novel = list(rng.integers(1000, 2000, size=60))
    phrase = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]
    context = [*novel, *phrase, 99]
    policy.begin(context)
    chosen = []
    # Plain decoding now writes the phrase again and again, one token per round.
    for step in range(len(phrase) * 6):
        plan = policy.plan(context)
        chosen.append(plan.drafter.name if plan.drafter is not None else "none")
        if plan.drafter is not None and plan.drafter.name == "ngram":
            break
        context.append(phrase[step % len(phrase)])
    assert chosen[0] == "none"
    assert chosen[-1] == "ngram", chosen
    assert policy.acceptance["ngram:4"].at(0) > 0.5


def test_cost_model_interpolates_and_learns_from_rounds():
    costs = CostModel({1: 0.03, 2: 0.06, 4: 0.10, 8: 0.20})
    assert costs.verify(3) == pytest.approx(0.08)
    assert costs.verify(16) == pytest.approx(0.40)
    for _ in range(60):
        costs.observe_verify(3, 0.05)
    assert costs.verify(3) == pytest.approx(0.05, rel=0.01)


# A target split over two workers with 2 ms added (benchmarks/split_target.py): a
# 2-token verify costs 1.77x a step, the local draft model a sixth of one.
SPLIT_COSTS = {1: 0.066, 2: 0.117, 4: 0.215, 8: 0.41, 16: 0.80}
SPLIT_DRAFT_STEP = 0.011


def test_one_stalled_round_does_not_make_the_draft_model_look_worth_it():
    policy = policy_with(SPLIT_COSTS, SPLIT_DRAFT_STEP, acceptance=0.93)
    policy.begin([1])
    assert policy.plan([1]).drafter is None
    # The first step after a prompt: the workers build the new graph (seen: 0.18-0.23 s).
    policy.observe(RoundOutcome("none", 0, 0, 0.228, 1))
    assert policy.costs.verify(1) < 0.075
    assert policy.plan([1]).drafter is None, policy.plan([1]).reason


def test_a_lasting_change_in_a_cost_still_comes_through():
    costs = CostModel({1: 0.066, 2: 0.117})
    for _ in range(25):
        costs.observe_verify(1, 0.20)  # the machine got busy: every step is slow now
    assert costs.verify(1) == pytest.approx(0.20, rel=0.05)
    for _ in range(25):
        costs.observe_verify(1, 0.05)
    assert costs.verify(1) == pytest.approx(0.05, rel=0.05)


def test_acceptance_estimate_weights_recent_rounds_more():
    estimate = AcceptanceEstimate(0.5)
    for _ in range(30):
        estimate.observe(drafted=4, accepted=4)
    high = estimate.at(0)
    for _ in range(10):
        estimate.observe(drafted=4, accepted=0)
    assert high > 0.95
    assert estimate.at(0) < 0.4
    assert estimate.expected_tokens(0) == 1.0


def test_exact_output_keeps_k_within_the_batches_measured_to_round_exactly():
    estimates = {"model": AcceptanceEstimate(0.9)}
    exact = AdaptiveDraftPolicy(
        [StubModelDrafter()],
        CostModel(dict(GPU_COSTS), GPU_DRAFT_STEP, exact_batch_limit=3),
        acceptance=estimates,
        exact=True,
    )
    exact.begin([1])
    assert 1 <= exact.plan([1]).draft_length <= 2
    any_batch = AdaptiveDraftPolicy(
        [StubModelDrafter()],
        CostModel(dict(GPU_COSTS), GPU_DRAFT_STEP, exact_batch_limit=3),
        acceptance=estimates,
        exact=False,
    )
    any_batch.begin([1])
    assert any_batch.plan([1]).draft_length > 2


def test_no_exact_batch_means_no_speculation_and_says_why():
    policy = AdaptiveDraftPolicy(
        [StubModelDrafter(), NgramDrafter()],
        CostModel(dict(GPU_COSTS), GPU_DRAFT_STEP, exact_batch_limit=1),
        acceptance={"model": AcceptanceEstimate(0.9)},
        exact=True,
    )
    policy.begin([1, 2, 3])
    for _ in range(MODEL_PROBE_INTERVAL + 2):
        plan = policy.plan([1, 2, 3])
        assert plan.draft_length == 0
    assert "rounds like one-token decoding" in plan.reason and "exact_output" in plan.reason


def test_confidence_floor_starts_at_break_even_and_follows_what_the_target_accepts():
    floor = ConfidenceFloor()
    assert floor.floor(0.4) == pytest.approx(0.4)  # a calibrated draft, until shown otherwise
    for _ in range(30):  # confident tokens pass, unsure ones are rejected
        floor.observe([0.95, 0.25], accepted=1)
    assert floor.floor(0.4) == pytest.approx(0.4)
    for _ in range(30):  # now even the draft's unsure guesses are accepted
        floor.observe([0.25, 0.15], accepted=2)
    assert floor.floor(0.4) <= 0.1
    assert floor.acceptance(1) > 0.8 and floor.acceptance(9) >= floor.acceptance(1)


def test_draft_model_rounds_stop_below_the_learned_floor_without_touching_the_shared_drafter():
    target = HashModel()
    shared = ModelDrafter(draft_model_for(target))
    policy = AdaptiveDraftPolicy(
        [shared],
        CostModel(dict(GPU_COSTS), GPU_DRAFT_STEP),
        acceptance={"model": AcceptanceEstimate(0.9)},
    )
    policy.begin([1, 2, 3])
    plan = policy.plan([1, 2, 3])
    assert plan.drafter is not None and plan.drafter.name == "model"
    assert plan.drafter is not shared and shared.min_confidence == 0.0
    assert plan.drafter.min_confidence > 0  # type: ignore[attr-defined]
    assert "stops below p" in plan.reason
    policy.observe(RoundOutcome("model", 3, 1, 0.02, 2, draft_confidences=(0.97, 0.12, 0.5)))
    assert policy.confidence_floor.trials[9] > 0 and policy.confidence_floor.trials[1] > 0


def test_what_auto_learned_about_the_draft_carries_over_to_the_next_reply():
    target = HashModel()
    engine = Engine(
        target, draft_model_for(target), costs=CostModel(dict(GPU_COSTS), GPU_DRAFT_STEP)
    )
    request = GenerationRequest(prompt_tokens=(1, 2, 3), max_tokens=24, drafter="auto")
    first = engine.policy_for(request)
    second = engine.policy_for(request)
    assert isinstance(first, AdaptiveDraftPolicy) and isinstance(second, AdaptiveDraftPolicy)
    assert second.acceptance is first.acceptance
    assert second.confidence_floor is first.confidence_floor
    # A bench mode (or any caller) can keep its own memory apart.
    engine.use_acceptance_memory({})
    third = engine.policy_for(request)
    assert isinstance(third, AdaptiveDraftPolicy)
    assert third.confidence_floor is not first.confidence_floor


def test_a_catch_up_in_a_model_round_does_not_make_the_draft_look_slow():
    costs = CostModel(dict(GPU_COSTS), GPU_DRAFT_STEP)
    policy = AdaptiveDraftPolicy(
        [StubModelDrafter()], costs, acceptance={"model": AcceptanceEstimate(0.9)}
    )
    policy.begin([1, 2, 3])
    assert policy.plan([1, 2, 3]).drafter is not None
    # A round whose only draft forward caught the draft up on the prompt times no step:
    # however long it took, the draft's step cost stays as it was.
    policy.observe(RoundOutcome("model", 1, 1, 0.03, 2, draft_step_seconds=None))
    assert costs.draft_step_seconds == pytest.approx(GPU_DRAFT_STEP)
    # Timed steps are learned from (once most recent ones say the same).
    for _ in range(5):
        policy.observe(RoundOutcome("model", 4, 4, 0.03, 5, draft_step_seconds=2 * GPU_DRAFT_STEP))
    assert costs.draft_step_seconds > GPU_DRAFT_STEP


class LaggingDraftModel:
    """A draft model's cache, as the controller sees it: the tokens it has read."""

    def __init__(self, cached_tokens: list[int]) -> None:
        self.cached_tokens = cached_tokens


def test_a_long_catch_up_keeps_a_marginal_draft_model_out_but_not_a_clear_winner():
    # Verify is nearly free and the draft costs a fifth of a step: the model wins
    # modestly once its cache is in step with the context.
    costs = {1: 0.030, 2: 0.031, 4: 0.033, 8: 0.040, 16: 0.060}
    context = list(range(1, 3001))
    drafter = StubModelDrafter()
    policy = AdaptiveDraftPolicy(
        [drafter], CostModel(dict(costs), 0.006), acceptance={"model": AcceptanceEstimate(0.6)}
    )
    policy.begin(context)
    drafter.model = LaggingDraftModel(context[:-1])  # in step: only the pending token is new
    in_step = policy.plan(context)
    assert in_step.drafter is not None and in_step.drafter.name == "model"
    # Having missed 2,999 tokens, it would first spend ~2 s reading them: more than
    # the modest gain would earn back over a reply.
    drafter.model = LaggingDraftModel([])
    lagging = policy.plan(context)
    assert lagging.drafter is None
    assert "read 2999 tokens it missed" in lagging.reason
    # A draft that is nearly always right still pays for the same catch-up.
    policy.acceptance["model"] = AcceptanceEstimate(0.97)
    assert policy.plan(context).drafter is not None


def test_an_eight_token_match_is_judged_apart_from_a_chance_three_token_one():
    # Copied stretches (8-token matches) were accepted; 3-token matches were chance.
    estimates = {"ngram:8": AcceptanceEstimate(0.95), "ngram:3": AcceptanceEstimate(0.1)}
    policy = AdaptiveDraftPolicy([NgramDrafter()], CostModel(dict(CPU_COSTS)), acceptance=estimates)
    line = list(range(100, 120))
    copying = [*line, 7, *line[:8]]  # the last 8 tokens occurred before: a copy in progress
    policy.begin(copying)
    plan = policy.plan(copying)
    assert plan.drafter is not None and plan.drafter.name == "ngram"
    assert plan.draft_length >= 3 and plan.estimated_speedup > 1.05
    chance = [*line, 7, 55, 56, *line[:3]]  # only 3 tokens repeat
    policy.begin(chance)
    assert policy.plan(chance).drafter is None


@pytest.mark.parametrize(
    ("drafter", "exact", "exact_batch_limit", "carried"),
    [("none", True, 3, 3), ("model", True, 3, 3), ("auto", True, 3, 3), ("none", False, 3, None)],
)
def test_every_policy_under_exact_output_carries_the_exact_batch_limit(
    drafter: str, exact: bool, exact_batch_limit: int, carried: int | None
) -> None:
    # The loop keeps a round's grammar-forced tokens within it, whatever the drafter
    # (a fixed K itself is verified as asked).
    target = HashModel()
    costs = CostModel(dict(GPU_COSTS), GPU_DRAFT_STEP, exact_batch_limit=exact_batch_limit)
    engine = Engine(target, draft_model_for(target), costs=costs)
    request = GenerationRequest((1, 2, 3), drafter=drafter, draft_tokens=6, exact=exact)
    policy = engine.policy_for(request)
    assert getattr(policy, "exact_batch_limit", None) == carried
