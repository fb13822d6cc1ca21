"""THE loop's statistics and cache discipline: counts, timing, rollback, provenance.

Every event's stats and the fakes' caches must agree after each round; host time leaves
out the runtimes' own calls; rejected drafts are rolled back; text carries where its
tokens came from.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Sequence

import numpy as np
import pytest

from backends.generation_events import (
    SpeculativeStats,
    speedup_over_plain_rounds,
)
from backends.sampling.filters import SamplingParams
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.prediction_drafter import PredictionDrafter
from tests.speculation.loop_helpers import (
    DRAFTER_KINDS,
    GREEDY,
    PROMPTS,
    SAMPLED,
    assert_invariants,
    make_drafter,
    new_target,
    perturbed,
    plain,
)
from tests.support.fake_runs import (
    ConstantDrafter,
    GenerationRecord,
    RecordingPolicy,
    chat_prompt,
    run_generation,
)
from tests.support.fakes import BOS, E_ACUTE_HEAD, HashModel, draft_model_for


def char_provenance(record: GenerationRecord, model: HashModel) -> list[bool]:
    """Per character of the decoded tokens: whether its completing token was drafted."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    flags: list[bool] = []
    for token, drafted in zip(record.tokens, record.from_draft, strict=True):
        flags.extend([drafted] * len(decoder.decode(model.token_bytes(token))))
    return flags


# -- statistics and cache discipline --------------------------------------------------------


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("draft_length", (0, 1, 3, 8))
@pytest.mark.parametrize("kind", DRAFTER_KINDS)
def test_stats_and_cache_invariants_hold_after_every_event(
    kind: str, draft_length: int, params: SamplingParams
) -> None:
    for prompt_text in PROMPTS:
        target = new_target(eos_bias=0.5)  # EOS is likely: some runs end on it
        prompt = chat_prompt(target, prompt_text)
        expected = run_generation(new_target(), prompt, plain(), GREEDY, max_tokens=90).tokens
        drafter = make_drafter(kind, target, expected)
        policy = RecordingPolicy(FixedDraftPolicy(drafter, draft_length))
        record = run_generation(target, prompt, policy, params, max_tokens=90)
        assert_invariants(record, draft_length)
        stats = record.stats
        assert target.forward_calls == stats.target_passes
        assert target.prefill_token_count == len(prompt) - 1
        assert policy.begun_with == [prompt]
        assert len(policy.outcomes) == stats.rounds
        assert sum(outcome.drafted for outcome in policy.outcomes) == stats.drafted
        assert sum(outcome.accepted for outcome in policy.outcomes) == stats.accepted
        expected_contexts = [len(prompt)]
        for event in record.events[:-1]:
            expected_contexts.append(expected_contexts[-1] + len(event.tokens))
        assert [length for length, _ in policy.plans] == expected_contexts[: stats.rounds]
        if isinstance(drafter, ModelDrafter):
            assert drafter.model.forward_calls == stats.draft_passes


def own_speedup(stats: SpeculativeStats) -> float | None:
    return speedup_over_plain_rounds(
        stats.generated_tokens, stats.decode_seconds, stats.plain_rounds, stats.plain_round_seconds
    )


def test_plain_decoding_is_its_own_baseline_and_a_mix_is_timed_by_its_plain_rounds() -> None:
    target = new_target()
    prompt = chat_prompt(target, PROMPTS[0])
    record = run_generation(target, prompt, plain(), GREEDY, max_tokens=40)
    stats = record.stats
    assert stats.plain_rounds == stats.rounds == 40
    # Every round of plain decoding is a plain round, so their times add up to it all.
    assert stats.plain_round_seconds == pytest.approx(stats.decode_seconds, rel=1e-9)
    assert own_speedup(stats) == pytest.approx(1.0)
    # N-gram drafts on a cycling text: some rounds draft, the others are plain.
    mixed = run_generation(
        new_target(), prompt, FixedDraftPolicy(NgramDrafter(), 4), GREEDY, max_tokens=90
    )
    assert 0 < mixed.stats.plain_rounds < mixed.stats.rounds
    assert mixed.stats.plain_round_seconds < mixed.stats.decode_seconds
    assert own_speedup(mixed.stats) is not None
    # Drafts in every round leave no plain round to compare with.
    always = FixedDraftPolicy(ModelDrafter(draft_model_for(target, noise_scale=0.0)), 4)
    drafted = run_generation(new_target(), prompt, always, GREEDY, max_tokens=40).stats
    assert drafted.plain_rounds == 0 and own_speedup(drafted) is None


class SlowForwardModel(HashModel):
    """A fake whose every forward and rollback sleeps: known time inside the runtime."""

    def __init__(self, forward_sleep: float, rollback_sleep: float, **options: object) -> None:
        super().__init__(**{"window": 2, "eos_bias": -4.0, **options})  # type: ignore[arg-type]
        self.forward_sleep = forward_sleep
        self.rollback_sleep = rollback_sleep

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        time.sleep(self.forward_sleep)
        return super().forward(tokens, last_only=last_only)

    def rollback(self, n_keep: int) -> None:
        time.sleep(self.rollback_sleep)
        super().rollback(n_keep)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_host_time_leaves_out_the_target_and_draft_runtime_calls(params: SamplingParams) -> None:
    target = SlowForwardModel(0.004, 0.001)
    draft = SlowForwardModel(0.002, 0.001, name="slow-draft", noise_scale=1.0)
    prompt = chat_prompt(target, PROMPTS[0])
    policy = FixedDraftPolicy(ModelDrafter(draft), 3)
    record = run_generation(target, prompt, policy, params, max_tokens=30)
    stats = record.stats
    # Sleeping guarantees at least this much time inside the runtimes during decode
    # (prefill is not decode; the draft model's first catch-up forward is).
    slept = (
        target.forward_calls * target.forward_sleep
        + (target.rollback_calls - 1) * target.rollback_sleep  # one rollback precedes prefill
        + draft.forward_calls * draft.forward_sleep
        + draft.rollback_calls * draft.rollback_sleep
    )
    assert 0.0 <= stats.host_seconds <= stats.decode_seconds - slept
    assert stats.host_ms_per_token == pytest.approx(
        1e3 * stats.host_seconds / stats.generated_tokens
    )
    snapshots = [event.stats.host_seconds for event in record.events]
    assert snapshots == sorted(snapshots), "host time only grows"
    as_dict = stats.as_dict()
    assert as_dict["host_seconds"] == round(stats.host_seconds, 6)
    assert as_dict["host_ms_per_token"] == round(stats.host_ms_per_token, 4)


def test_host_time_is_zero_per_token_before_any_token() -> None:
    assert SpeculativeStats().host_ms_per_token == 0.0
    assert SpeculativeStats().as_dict()["host_ms_per_token"] == 0.0


def test_rejected_tokens_are_rolled_back() -> None:
    baseline_target = new_target()
    prompt = chat_prompt(baseline_target, PROMPTS[0])
    baseline = run_generation(baseline_target, prompt, plain(), GREEDY, max_tokens=40)
    target = new_target()
    # The target never writes BOS, so every drafted BOS is rejected.
    record = run_generation(
        target, prompt, FixedDraftPolicy(ConstantDrafter(BOS), 4), GREEDY, max_tokens=40
    )
    assert record.tokens == baseline.tokens
    assert record.stats.accepted == 0 and record.stats.drafted > 0
    assert record.stats.accepted_length_histogram == (record.stats.speculative_rounds,)
    # Each round emits one token; K shrinks only at the end (it is capped at remaining - 1).
    assert target.forward_batch_sizes == [1 + min(4, 40 - 1 - done) for done in range(40)]
    assert BOS not in target.cached_tokens[len(prompt) :]
    assert_invariants(record, 4)


def test_rejected_tokens_are_rolled_back_when_sampling() -> None:
    target = new_target()
    prompt = chat_prompt(target, PROMPTS[1])
    record = run_generation(
        target, prompt, FixedDraftPolicy(ConstantDrafter(BOS), 3), SAMPLED, max_tokens=40
    )
    assert record.stats.accepted == 0 and BOS not in record.tokens
    assert_invariants(record, 3)


def test_text_segments_carry_the_provenance_of_their_tokens() -> None:
    target = new_target()
    prompt = chat_prompt(target, PROMPTS[0])
    expected = run_generation(new_target(), prompt, plain(), GREEDY, max_tokens=100).tokens
    if expected[-1] == E_ACUTE_HEAD:  # keep the final flush out of the comparison
        expected = expected[:-1]
    record = run_generation(
        target,
        prompt,
        FixedDraftPolicy(PredictionDrafter(perturbed(expected)), 4),
        GREEDY,
        max_tokens=len(expected),
    )
    shown = [s.from_draft for event in record.events for s in event.segments for _ in s.text]
    assert shown == char_provenance(record, target)
    assert True in shown and False in shown
