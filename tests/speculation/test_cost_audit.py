"""`auto` holds its stored figures to what the loop measures (cost_audit.py).

The runtimes here cost virtual time: each forward moves a clock that replaces
``time.perf_counter`` by what a forward of its size costs, so the loop, the controller
and the audit see exactly the costs the test sets, on any machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.generation_events import GenerationEvent
from backends.speculation import cost_audit
from backends.speculation.calibration import disturbed, measure_costs
from backends.speculation.controller import PLAIN_CHECK_REASON
from backends.speculation.cost_audit import CostAudit
from backends.speculation.cost_model import CostModel, SharedForwardCosts
from tests.support.fake_runs import chat_prompt
from tests.support.fakes import HashModel

# The curve stored during a compile on the 2-core EPYC (issue 51), in seconds: a quiet
# one-token forward there costs ~0.045 s.
BUSY_CURVE = {1: 0.295, 2: 0.428, 3: 0.283, 4: 0.500, 5: 0.808, 8: 1.453, 16: 1.469}
BUSY_DRAFT_STEP = 0.059


def cpu_like(tokens: int) -> float:
    """A compute-bound CPU: a batch costs nearly its tokens' one-token forwards."""
    return 0.045 * (0.3 + 0.7 * tokens)


def gpu_like(tokens: int) -> float:
    """A GPU: a verify of a few tokens costs about one step."""
    return 0.008 + 0.0003 * (tokens - 1)


class VirtualClock:
    """Stands in for ``time.perf_counter``: moves only when a forward runs."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TimedModel(HashModel):
    """A HashModel whose forwards cost ``cost(tokens) * load`` of virtual time;
    ``stalls`` more forwards each take ten times as long."""

    def __init__(self, clock: VirtualClock, cost: Callable[[int], float], **options: object):
        super().__init__(n_ctx=2048, **options)  # type: ignore[arg-type]
        self.clock = clock
        self.cost = cost
        self.load = 1.0
        self.stalls = 0

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        seconds = self.cost(len(tokens)) * self.load
        if self.stalls:
            self.stalls -= 1
            seconds *= 10
        self.clock.now += seconds
        return super().forward(tokens, last_only=last_only)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    virtual = VirtualClock()
    monkeypatch.setattr("time.perf_counter", virtual)
    return virtual


def pair(
    clock: VirtualClock, cost: Callable[[int], float], draft_step: float, noise: float
) -> tuple[TimedModel, TimedModel]:
    """A target and a draft model that agrees with it as far as ``noise`` lets it."""
    target = TimedModel(clock, cost, eos_bias=-20.0)  # long replies: no early end
    draft = TimedModel(
        clock,
        lambda tokens: draft_step * tokens,
        name="hash-draft",
        noise_scale=noise,
        window=target.window,
        salt=target.salt,
        scale=target.scale,
        eos_bias=target.eos_bias,
    )
    return target, draft


def reply(engine: Engine, text: str, max_tokens: int = 160) -> list[GenerationEvent]:
    prompt = chat_prompt(engine.target, text)  # type: ignore[arg-type]
    request = GenerationRequest(tuple(prompt), max_tokens=max_tokens, drafter="auto")
    return list(engine.generate(request))


def plain_share(events: Sequence[GenerationEvent]) -> float:
    stats = events[-1].stats
    return stats.plain_rounds / stats.rounds


def test_the_busy_curve_is_corrected_within_one_reply_and_auto_stops_drafting_at_a_loss(
    clock: VirtualClock,
) -> None:
    target, draft = pair(clock, cpu_like, draft_step=0.015, noise=0.6)
    costs = CostModel(dict(BUSY_CURVE), BUSY_DRAFT_STEP)
    stored: list[cost_audit.CostCorrection] = []
    costs.audit.on_correction = stored.append
    engine = Engine(target, draft, costs=costs)
    events = reply(engine, "write a function that adds two numbers")
    # The one-token figure is what plain decoding is measured against: found 6.5x too
    # high and replaced by what a one-token forward costs here.
    assert costs.target_seconds[1] == pytest.approx(cpu_like(1))
    assert any(correction.key == 1 for correction in stored)
    # Sizes measured since are corrected too; the rest were scaled, never below T(1).
    assert all(seconds >= costs.target_seconds[1] for seconds in costs.target_seconds.values())
    # Here drafting with the model loses (a verify of n costs nearly n steps): once the
    # figures are right, the rest of the reply is plain decoding.
    tail = events[len(events) // 2 :]
    assert all(event.draft_length == 0 for event in tail)
    assert events[2].costs_note == "one-token forward 45 ms measured, 295 ms stored"
    # And within this first reply, no slower than plain decoding (virtual time: exact).
    stats = events[-1].stats
    assert stats.decode_seconds <= stats.generated_tokens * cpu_like(1) / 0.97


def test_a_machine_that_becomes_busy_then_quiet_is_tracked_both_ways(clock: VirtualClock) -> None:
    target, draft = pair(clock, cpu_like, draft_step=0.015, noise=0.6)
    quiet = measure_costs(target, draft)
    assert quiet.target_seconds[1] == pytest.approx(cpu_like(1))
    engine = Engine(target, draft, costs=quiet)
    reply(engine, "a first reply on a quiet machine")
    assert not quiet.corrections

    target.load = draft.load = 3.0  # a compile starts beside us
    reply(engine, "a reply while the machine is busy")
    assert quiet.target_seconds[1] == pytest.approx(3 * cpu_like(1))
    assert quiet.corrections[-1].key == 1

    target.load = draft.load = 1.0  # and stops
    reply(engine, "a reply once the machine is quiet again")
    assert quiet.target_seconds[1] == pytest.approx(cpu_like(1))
    assert len(quiet.corrections) == 2


def test_one_stalled_step_moves_no_figure_and_drafting_goes_on(clock: VirtualClock) -> None:
    target, draft = pair(clock, gpu_like, draft_step=0.0015, noise=0.0)
    costs = measure_costs(target, draft)
    figures = dict(costs.target_seconds)
    engine = Engine(target, draft, costs=costs)
    reply(engine, "warm up", max_tokens=24)
    target.stalls = 1  # the next forward (a verify) takes ten times as long
    events = reply(engine, "a reply with one stall in it", max_tokens=200)
    assert not costs.corrections
    assert costs.target_seconds[1] == pytest.approx(figures[1])
    # It drafted throughout, but for the few rounds that time a one-token step.
    assert plain_share(events) < 0.15
    assert events[-1].stats.speculative_rounds > 10


def test_a_one_token_figure_2x_too_high_is_found_within_the_reply_on_a_gpu(
    clock: VirtualClock,
) -> None:
    target, draft = pair(clock, gpu_like, draft_step=0.0015, noise=0.0)
    costs = measure_costs(target, draft)
    costs.target_seconds[1] *= 2  # a verify of 5 now costs less than one token: impossible
    engine = Engine(target, draft, costs=costs)
    events = reply(engine, "a reply on a fast machine", max_tokens=120)
    assert costs.target_seconds[1] == pytest.approx(gpu_like(1))
    checks = [event for event in events if event.decision == PLAIN_CHECK_REASON]
    assert 1 <= len(checks) <= cost_audit.MOST_CONFIRMING_ROUNDS


def test_while_drafting_a_one_token_step_is_timed_every_interval_and_no_more(
    clock: VirtualClock,
) -> None:
    target, draft = pair(clock, gpu_like, draft_step=0.0015, noise=0.0)
    engine = Engine(target, draft, costs=measure_costs(target, draft))
    events = reply(engine, "a long reply that is drafted all along", max_tokens=1800)
    drafting = sum(1 for event in events if event.draft_length > 0)
    checks = sum(1 for event in events if event.decision == PLAIN_CHECK_REASON)
    assert drafting > 2 * cost_audit.PLAIN_CHECK_INTERVAL
    assert checks == pytest.approx(drafting / cost_audit.PLAIN_CHECK_INTERVAL, abs=1)


def test_rules_one_fast_measurement_asks_for_another_and_two_replace() -> None:
    audit = CostAudit()
    assert audit.check(1, 0.3, 0.045) is None
    assert audit.take_plain_check()  # one more plain round decides
    assert audit.check(1, 0.3, 0.046) == pytest.approx(0.046)
    assert not audit.take_plain_check()
    assert audit.since(0) == "one-token forward 46 ms measured, 300 ms stored"


def test_rules_a_slower_figure_needs_the_median_of_three() -> None:
    audit = CostAudit()
    assert audit.check(4, 0.1, 0.5) is None  # a stall
    assert audit.check(4, 0.1, 0.1) is None
    assert audit.check(4, 0.1, 0.1) is None
    assert audit.check(4, 0.1, 0.2) is None  # two of the last three slow now
    assert audit.check(4, 0.1, 0.2) == pytest.approx(0.2)


def test_no_plain_check_while_other_sequences_share_the_forwards() -> None:
    costs = CostModel({1: 0.3, 5: 0.4})
    costs.observe_verify(5, 0.05)  # contradicts T(1): a check would be due
    assert SharedForwardCosts(costs, lambda: 2).take_plain_check() is False
    assert SharedForwardCosts(costs, lambda: 1).take_plain_check() is True


def test_disturbed_knows_the_busy_curve_and_a_busy_machine() -> None:
    busy = CostModel(dict(BUSY_CURVE), BUSY_DRAFT_STEP)
    why = disturbed(busy)
    assert why is not None and "more than one of 3 tokens" in why
    quiet = {size: cpu_like(size) for size in BUSY_CURVE}
    assert disturbed(CostModel(dict(quiet))) is None
    shared = CostModel(dict(quiet), others_cpu_share=0.9)
    assert "other processes used 90% of the CPUs" in (disturbed(shared) or "")
    drifted = CostModel(dict(quiet), one_token_fastest=0.02)
    assert "but 20 ms at best" in (disturbed(drifted) or "")


def test_calibration_notes_when_and_how_busy_it_was_taken(clock: VirtualClock) -> None:
    target = TimedModel(clock, cpu_like)
    costs = measure_costs(target)
    assert costs.taken_at is not None and costs.taken_at > 1e9
    assert costs.others_cpu_share is not None and costs.others_cpu_share >= 0.0
    assert costs.one_token_fastest == pytest.approx(cpu_like(1))
