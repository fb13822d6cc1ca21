"""Drafting the next round during a split target's verify (backends/speculation/overlap.py).

The target here is a fake "split" one: each forward sleeps a little, as a forward that
waits on workers does, and records which thread ran it. The draft model is the fakes'
hash model, either equal to the target (every guess holds) or noisy (guesses fail).
No timings are asserted: the output, the counts and the caches are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.runtime_exchange import is_computing_beside
from backends.sampling.filters import SamplingParams
from backends.speculation.draft_policy import FixedDraftPolicy, RoundOutcome, RoundPlan
from backends.speculation.loop import speculative_generate
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.overlap import _PreDraft, _serving
from backends.speculation.proposal import Drafter
from backends.speculation.reply_spec import LoopHooks, ReplySpec
from tests.speculation.fake_head import FakeHead
from tests.support.fake_runs import chat_prompt
from tests.support.fakes import HashModel, draft_model_for

GREEDY = SamplingParams()
PROMPTS = ("the cat sat on the mat", "is this a test, 42 is the answer!")
NETWORK_WAIT = 0.002  # seconds each forward of the split target waits


class SplitTarget(HashModel):
    """A target whose forwards wait like a verify on workers does, noting their thread."""

    splits_over_workers = True

    def __init__(self, **options: object) -> None:
        settings: dict[str, object] = {"window": 2, "eos_bias": -4.0}
        settings.update(options)
        super().__init__(**settings)  # type: ignore[arg-type]
        self.forward_threads: list[tuple[int, bool]] = []

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Wait, then compute as the hash model does."""
        self.forward_threads.append((threading.get_ident(), is_computing_beside()))
        time.sleep(NETWORK_WAIT)
        return super().forward(tokens, last_only=last_only)


def generate(
    target: HashModel,
    prompt: list[int],
    policy: object,
    *,
    overlap: bool,
    max_tokens: int = 96,
    params: SamplingParams = GREEDY,
) -> tuple[list[int], list[bool], dict[str, object]]:
    """The tokens, their provenance and the final stats of one generation."""
    target.rollback(0)
    tokens: list[int] = []
    provenance: list[bool] = []
    stats: dict[str, object] = {}
    for event in speculative_generate(
        target, prompt, policy, ReplySpec(params, max_tokens), LoopHooks(overlap_drafting=overlap)
    ):
        tokens.extend(event.tokens)
        provenance.extend(event.from_draft)
        stats = event.stats.as_dict()
    return tokens, provenance, stats


@pytest.mark.parametrize("noise", [0.0, 1.0])
@pytest.mark.parametrize("draft_tokens", [1, 2, 4])
def test_greedy_output_and_drafts_are_the_same_with_the_overlap_on_and_off(
    noise: float, draft_tokens: int
) -> None:
    # Each round drafts the draft model's greedy chain from the committed context,
    # pre-drafted or not: so not only the output, every round's drafts and their
    # acceptance are the same. A discarded pre-draft (noise 1: guesses fail) that left
    # the draft model's cache stale would change the drafts after it.
    for text in PROMPTS:
        target = SplitTarget()
        prompt = chat_prompt(target, text)
        runs = {}
        for overlap in (False, True):
            drafter = ModelDrafter(draft_model_for(target, noise_scale=noise))
            policy = FixedDraftPolicy(drafter, draft_tokens)
            runs[overlap] = generate(target, prompt, policy, overlap=overlap)
        plain = generate(target, prompt, FixedDraftPolicy(None, 0), overlap=False)
        (off_tokens, off_from, off_stats), (on_tokens, on_from, on_stats) = runs[0], runs[1]
        assert on_tokens == off_tokens == plain[0]
        assert on_from == off_from
        for key in ("drafted", "accepted", "rounds", "target_passes"):
            assert on_stats[key] == off_stats[key], key
        assert off_stats["predrafted_rounds"] == off_stats["predrafts_used"] == 0
        assert on_stats["predrafted_rounds"] > 0


def test_every_predraft_is_used_while_the_guesses_hold_and_few_when_they_fail() -> None:
    target = SplitTarget()
    prompt = chat_prompt(target, PROMPTS[0])
    exact = FixedDraftPolicy(ModelDrafter(draft_model_for(target, noise_scale=0.0)), 3)
    _, _, held = generate(target, prompt, exact, overlap=True)
    # The draft model is the target: every guess holds, and every pre-draft but one made
    # in the last round (or near the context's end) is used.
    assert held["accepted"] == held["drafted"]
    assert held["predrafts_used"] >= held["predrafted_rounds"] - 1 > 0
    noisy = FixedDraftPolicy(ModelDrafter(draft_model_for(target, noise_scale=2.0)), 3)
    _, _, failed = generate(target, prompt, noisy, overlap=True)
    assert failed["accepted"] < failed["drafted"]
    assert failed["predrafts_used"] < failed["predrafted_rounds"]


def test_the_verify_runs_beside_the_drafting_thread_only_with_the_overlap() -> None:
    target = SplitTarget()
    prompt = chat_prompt(target, PROMPTS[1])
    policy = FixedDraftPolicy(ModelDrafter(draft_model_for(target, noise_scale=0.0)), 2)
    here = threading.get_ident()
    generate(target, prompt, policy, overlap=False)
    assert all(thread == here and not beside for thread, beside in target.forward_threads)
    target.forward_threads.clear()
    generate(target, prompt, policy, overlap=True)
    helper = [(thread, beside) for thread, beside in target.forward_threads if thread != here]
    assert helper and all(beside for _, beside in helper)
    # Nothing is left marked: the loop's own thread never computes "beside".
    assert not is_computing_beside()


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.8, seed=3), SamplingParams(presence_penalty=0.5)],
    ids=["sampling", "penalties"],
)
def test_sampling_and_penalties_keep_the_overlap_off(params: SamplingParams) -> None:
    target = SplitTarget()
    prompt = chat_prompt(target, PROMPTS[0])
    policy = FixedDraftPolicy(ModelDrafter(draft_model_for(target, noise_scale=0.5)), 2)
    on = generate(target, prompt, policy, overlap=True, params=params)
    off = generate(target, prompt, policy, overlap=False, params=params)
    assert on[0] == off[0]
    assert on[2]["predrafted_rounds"] == 0


class ScheduledPolicy:
    """Plans a fixed cycle of (drafter, K), as ``auto`` might change its mind per round."""

    LEARNS = False
    FIRST_TOKEN_NEVER_WAITS = False
    exact_batch_limit = None

    def __init__(self, schedule: list[tuple[Drafter | None, int]]) -> None:
        self.schedule = schedule
        self.rounds = 0

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        for drafter, _ in self.schedule:
            if drafter is not None:
                drafter.begin(prompt_tokens)

    def plan(self, context: Sequence[int]) -> RoundPlan:
        drafter, length = self.schedule[self.rounds % len(self.schedule)]
        self.rounds += 1
        return RoundPlan(drafter, length)

    def observe(self, outcome: RoundOutcome) -> None:
        """Nothing to learn."""


def test_a_changed_plan_uses_a_shorter_predraft_and_drops_a_longer_or_other_one() -> None:
    target = SplitTarget()
    prompt = chat_prompt(target, PROMPTS[0])
    model = ModelDrafter(draft_model_for(target, noise_scale=0.0))
    # K=3 then K=2 (served, cut), K=4 (more than pre-drafted: dropped), n-gram (dropped),
    # plain (dropped), then K=3 again after a round that pre-drafted nothing.
    schedule = [(model, 3), (model, 2), (model, 4), (NgramDrafter(), 2), (None, 0), (model, 3)]
    plain = generate(target, prompt, FixedDraftPolicy(None, 0), overlap=False)
    on = generate(target, prompt, ScheduledPolicy(schedule), overlap=True)
    off = generate(target, prompt, ScheduledPolicy(schedule), overlap=False)
    assert on[0] == off[0] == plain[0]
    assert on[1] == off[1]
    used, made = on[2]["predrafts_used"], on[2]["predrafted_rounds"]
    assert isinstance(used, int) and isinstance(made, int)
    # Per cycle: pre-drafts after K=3, K=2 and K=4; only K=3 -> K=2 serves (the last
    # cycle may be cut short by max_tokens).
    assert 0 < used < made


def test_a_predraft_serves_only_the_context_it_guessed_cut_to_the_plan_and_floor() -> None:
    target = SplitTarget()
    draft = draft_model_for(target, noise_scale=0.0)
    ready = _PreDraft(
        model=draft,
        expected=[1, 2, 3, 4],
        length=3,
        tokens=[5, 6, 7],
        top_probs=[0.9, 0.2, 0.8],
        step_seconds=0.01,
    )
    drafter = ModelDrafter(draft)
    served = _serving(ready, drafter, [1, 2, 3, 4], 2)
    assert served is not None and served.tokens == [5, 6] and served.passes == 0
    assert _serving(ready, drafter, [1, 2, 3, 4], 4) is None  # longer than pre-drafted
    assert _serving(ready, drafter, [1, 2, 3, 9], 3) is None  # the bonus was not the guess
    assert _serving(ready, drafter, [1, 2, 9], 3) is None  # a draft was rejected
    other = ModelDrafter(draft_model_for(target, noise_scale=1.0))
    assert _serving(ready, other, [1, 2, 3, 4], 3) is None  # another draft model
    floored = ModelDrafter(draft, min_confidence=0.5)
    served = _serving(ready, floored, [1, 2, 3, 4], 3)
    assert served is not None and served.tokens == [5]  # stops before the 0.2 token


def test_the_engine_overlaps_only_with_a_split_target_and_a_draft_model() -> None:
    split = SplitTarget()
    engine = Engine(split, draft_model_for(split, noise_scale=0.0))
    assert engine.overlaps()
    assert not Engine(split).overlaps()
    local = HashModel()
    assert not Engine(local, draft_model_for(local)).overlaps()
    # A split target with an MTP head: the verify's decode would feed the head there.
    headed = SplitTarget()
    headed.mtp_head = lambda: FakeHead(headed)  # type: ignore[attr-defined]
    assert not Engine(headed, draft_model_for(headed)).overlaps()
    prompt = tuple(chat_prompt(split, PROMPTS[0]))
    for overlap in (True, False):
        request = GenerationRequest(
            prompt, drafter="model", draft_tokens=2, max_tokens=32, overlap_drafting=overlap
        )
        events = list(engine.generate(request))
        made = events[-1].stats.predrafted_rounds
        assert (made > 0) == overlap
