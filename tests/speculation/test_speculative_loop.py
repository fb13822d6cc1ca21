"""THE loop, driven by fake models: exactness, statistics, cache discipline, finishing.

Every run goes through ``speculative_generate`` with models from ``tests/fakes.py``,
which are strict the way a runtime is: they raise past ``n_ctx`` and overwrite the
logits they returned on the next call, so a loop that evaluates too much or reads
stale logits fails here.
"""

from __future__ import annotations

import codecs
import math
import threading
import time
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pytest

from backends.base import Model
from backends.errors import ContextOverflowError, DecodeError
from backends.generation_events import (
    FINISH_CANCELLED,
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationEvent,
    SpeculativeStats,
    speedup_over_plain_rounds,
)
from backends.sampling.filters import SamplingParams, distribution
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.loop import PREFILL_SLICE, speculative_generate
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.prediction_drafter import PredictionDrafter
from backends.speculation.proposal import Drafter
from tests.support.fakes import (
    BOS,
    E_ACUTE_HEAD,
    EOS,
    ConstantDrafter,
    GenerationRecord,
    HashModel,
    RecordingPolicy,
    ScriptedTextModel,
    chat_prompt,
    draft_model_for,
    run_generation,
)

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
PROMPTS = ("the cat sat on the mat", "is this a test, 42 is the answer!")
DRAFTER_KINDS = ("model", "ngram", "prediction")
DRAFT_LENGTHS = (1, 2, 4, 8)


def new_target(**options: object) -> HashModel:
    """The standard fake target: its greedy output falls into cycles (n-grams pay)."""
    settings: dict[str, object] = {"window": 2, "eos_bias": -4.0}
    settings.update(options)
    return HashModel(**settings)  # type: ignore[arg-type]


def plain() -> FixedDraftPolicy:
    return FixedDraftPolicy(None, 0)


def perturbed(tokens: list[int]) -> list[int]:
    """A prediction that is mostly right: a substitution, a deletion, an insertion."""
    prediction = list(tokens[:100])
    prediction[10:11] = [BOS]
    del prediction[30:31]
    prediction[50:50] = [7, 7]
    return prediction


def make_drafter(kind: str, target: HashModel, expected_tokens: list[int]) -> Drafter:
    if kind == "model":
        return ModelDrafter(draft_model_for(target, noise_scale=1.0))
    if kind == "ngram":
        return NgramDrafter()
    return PredictionDrafter(perturbed(expected_tokens))


def char_provenance(record: GenerationRecord, model: HashModel) -> list[bool]:
    """Per character of the decoded tokens: whether its completing token was drafted."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    flags: list[bool] = []
    for token, drafted in zip(record.tokens, record.from_draft, strict=True):
        flags.extend([drafted] * len(decoder.decode(model.token_bytes(token))))
    return flags


def ended_on_text(event: GenerationEvent) -> bool:
    """The reply ended at a stop string or a repeated call, maybe inside the round."""
    return event.stop_sequence is not None or event.repeated_call


def assert_invariants(record: GenerationRecord, max_draft: int) -> None:
    """What must hold for every event and for the whole generation."""
    previous = SpeculativeStats()
    committed = list(record.prompt)
    for index, (event, cache) in enumerate(zip(record.events, record.caches, strict=True)):
        stats = event.stats
        final = index == len(record.events) - 1
        assert (event.finish_reason is not None) == final
        assert len(event.tokens) == len(event.from_draft)
        assert event.text == "".join(segment.text for segment in event.segments)
        assert all(segment.text for segment in event.segments)
        assert all(a.from_draft != b.from_draft for a, b in pairwise(event.segments))
        histogram = stats.accepted_length_histogram
        assert sum(histogram) == stats.speculative_rounds
        assert sum(length * count for length, count in enumerate(histogram)) == stats.accepted
        assert stats.accepted <= stats.drafted
        assert stats.target_passes == stats.rounds
        assert stats.plain_rounds == stats.rounds - stats.speculative_rounds
        assert 0.0 <= stats.plain_round_seconds <= stats.decode_seconds
        assert stats.prompt_tokens == len(record.prompt)
        committed.extend(event.tokens)
        assert stats.generated_tokens == len(committed) - len(record.prompt)
        assert 0 <= event.draft_length <= max_draft

        new_rounds = stats.rounds - previous.rounds
        if new_rounds == 0:
            # A closing event without a round (cancelled, or the context is full).
            assert final and event.tokens == () and event.draft_length == 0
            assert stats.drafted == previous.drafted and stats.accepted == previous.accepted
        else:
            assert new_rounds == 1
            assert stats.drafted - previous.drafted == event.draft_length
            assert stats.speculative_rounds - previous.speculative_rounds == (
                1 if event.draft_length else 0
            )
            flags = list(event.from_draft)
            from_draft = sum(flags)
            assert flags == [True] * from_draft + [False] * (len(flags) - from_draft)
            assert len(flags) - from_draft <= 1, "one target token per round at most"
            accepted = stats.accepted - previous.accepted
            if ended_on_text(event):
                # Drafts accepted past a stop string are not the reply's (nor counted).
                assert accepted >= from_draft
            elif accepted == from_draft + 1:  # an accepted EOS draft ends the reply, unshown
                assert event.finish_reason == FINISH_STOP and len(flags) == from_draft
            else:
                assert accepted == from_draft

        # The target's cache holds the committed tokens minus the pending one.
        if not final:
            assert list(cache) == committed[:-1]
        elif ended_on_text(event):
            assert list(cache)[: len(committed) - 1] == committed[:-1]
        elif event.finish_reason == FINISH_STOP:
            assert list(cache) in (committed[:-1], committed, [*committed, EOS])
        else:
            assert list(cache) == committed[:-1]
        previous = stats
    assert record.stats.generated_tokens == len(record.tokens)


# -- the fake itself -------------------------------------------------------------------


def test_fake_models_implement_the_model_protocol() -> None:
    for model in (new_target(), draft_model_for(new_target()), ScriptedTextModel("hi")):
        assert isinstance(model, Model)


def test_fake_batched_forward_equals_one_token_at_a_time() -> None:
    tokens = chat_prompt(new_target(), "the café is ü!")
    batched = new_target().forward(tokens).copy()
    single = new_target()
    rows = [single.forward([token])[0].copy() for token in tokens]
    np.testing.assert_array_equal(batched, np.stack(rows))
    last = new_target().forward(tokens, last_only=True)
    np.testing.assert_array_equal(last, batched[-1:])


def test_fake_tracks_its_cache_and_refuses_to_overflow() -> None:
    model = new_target(n_ctx=8)
    model.prefill([1, 20, 21])
    logits = model.forward([22, 23])
    assert logits.shape == (2, model.n_vocab)
    assert model.cached_tokens == (1, 20, 21, 22, 23)
    kept = logits.copy()
    model.forward([24])
    # Like a runtime's buffer, the returned view is overwritten by the next call.
    assert not np.array_equal(logits[0], kept[0]) and np.isnan(logits[1]).all()
    model.rollback(2)
    assert model.cached_tokens == (1, 20)
    with pytest.raises(DecodeError):
        model.forward([30] * 7)
    with pytest.raises(ValueError):
        model.rollback(3)
    model.close()
    with pytest.raises(DecodeError):
        model.forward([30])


# -- exactness ----------------------------------------------------------------------------


@pytest.mark.parametrize("draft_length", DRAFT_LENGTHS)
@pytest.mark.parametrize("kind", DRAFTER_KINDS)
def test_greedy_speculative_output_equals_plain_decoding_token_for_token(
    kind: str, draft_length: int
) -> None:
    for prompt_text in PROMPTS:
        baseline_target = new_target()
        prompt = chat_prompt(baseline_target, prompt_text)
        baseline = run_generation(baseline_target, prompt, plain(), GREEDY, max_tokens=120)
        target = new_target()
        drafter = make_drafter(kind, target, baseline.tokens)
        policy = FixedDraftPolicy(drafter, draft_length)
        record = run_generation(target, prompt, policy, GREEDY, max_tokens=120)
        assert record.tokens == baseline.tokens
        assert record.text == baseline.text
        assert record.finish_reason == baseline.finish_reason
        assert record.stats.accepted > 0, "the drafter helped, so the check is not vacuous"
        assert record.stats.target_passes < baseline.stats.target_passes


@pytest.mark.parametrize("draft_length", (2, 4))
def test_greedy_output_is_exact_with_a_confidence_floor_on_the_draft_model(
    draft_length: int,
) -> None:
    baseline_target = new_target()
    prompt = chat_prompt(baseline_target, PROMPTS[0])
    baseline = run_generation(baseline_target, prompt, plain(), GREEDY, max_tokens=80)
    target = new_target()
    drafter = ModelDrafter(draft_model_for(target, noise_scale=1.0), min_confidence=0.5)
    record = run_generation(
        target, prompt, FixedDraftPolicy(drafter, draft_length), GREEDY, max_tokens=80
    )
    assert record.tokens == baseline.tokens
    assert record.stats.drafted < record.stats.speculative_rounds * draft_length


@pytest.mark.parametrize("kind", DRAFTER_KINDS)
def test_sampling_with_a_seed_is_reproducible(kind: str) -> None:
    def sample(seed: int) -> GenerationRecord:
        target = new_target()
        prompt = chat_prompt(target, PROMPTS[1])
        expected = run_generation(new_target(), prompt, plain(), GREEDY, max_tokens=60).tokens
        drafter = make_drafter(kind, target, expected)
        params = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
        return run_generation(target, prompt, FixedDraftPolicy(drafter, 4), params, max_tokens=60)

    first, again = sample(7), sample(7)
    assert first.tokens == again.tokens and first.from_draft == again.from_draft
    assert first.text == again.text and first.stats.accepted == again.stats.accepted
    assert any(sample(seed).tokens != first.tokens for seed in (8, 9, 10))


def test_plain_sampling_with_a_seed_is_reproducible() -> None:
    prompt = chat_prompt(new_target(), PROMPTS[0])
    runs = [run_generation(new_target(), prompt, plain(), SAMPLED, max_tokens=50) for _ in "ab"]
    assert runs[0].tokens == runs[1].tokens


def expected_first_two(
    target: HashModel, prompt: list[int], params: SamplingParams
) -> dict[tuple[int, int], float]:
    """The target's exact joint distribution of the first two tokens."""
    first = distribution(target.logits_for(prompt), params)
    joint = {}
    for a, p_a in zip(first.ids.tolist(), first.probs, strict=True):
        second = distribution(target.logits_for([*prompt, a]), params)
        for b, p_b in zip(second.ids.tolist(), second.probs, strict=True):
            joint[(a, b)] = float(p_a * p_b)
    return joint


def sampled_first_two(
    target: HashModel, prompt: list[int], drafter: Drafter, params: SamplingParams, runs: int
) -> tuple[dict[tuple[int, int], float], float]:
    """Empirical joint of the first two tokens over ``runs`` seeded generations, and
    how often the first draft token was accepted."""
    counts: dict[tuple[int, int], int] = {}
    first_accepted = 0
    policy = FixedDraftPolicy(drafter, 2)
    for seed in range(runs):
        seeded = SamplingParams(temperature=params.temperature, top_k=params.top_k, seed=seed)
        # max_tokens=3 lets the first round draft two tokens (K is capped at remaining - 1).
        record = run_generation(target, prompt, policy, seeded, max_tokens=3)
        key = (record.tokens[0], record.tokens[1])
        counts[key] = counts.get(key, 0) + 1
        first_accepted += record.from_draft[0]
    return {key: count / runs for key, count in counts.items()}, first_accepted / runs


def tv_distance(left: dict[tuple[int, int], float], right: dict[tuple[int, int], float]) -> float:
    keys = set(left) | set(right)
    return 0.5 * sum(abs(left.get(key, 0.0) - right.get(key, 0.0)) for key in keys)


def tv_bound(n: int, support: int) -> float:
    """As in test_sampling_lossless: exceeded with probability <= 1e-6 if exact."""
    return 0.5 * math.sqrt(support / n) + math.sqrt(math.log(1e6) / (2 * n))


@pytest.mark.parametrize(
    ("drafter_name", "runs"), [("draft_model", 1500), ("point_mass_prediction", 1000)]
)
def test_sampled_speculative_tokens_follow_the_target_joint_distribution(
    drafter_name: str, runs: int
) -> None:
    target = new_target(window=3)
    prompt = chat_prompt(target, "hi")
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = expected_first_two(target, prompt, params)
    assert EOS not in {token for pair in exact for token in pair}
    p_first = distribution(target.logits_for(prompt), params)
    if drafter_name == "draft_model":
        draft = draft_model_for(target, noise_scale=1.0)
        drafter: Drafter = ModelDrafter(draft)
        draft_joint = expected_first_two(draft, prompt, params)
        q_first = distribution(draft.logits_for(prompt), params)
        ids = np.union1d(p_first.ids, q_first.ids)
        acceptance = float(np.minimum(p_first.probs_at(ids), q_first.probs_at(ids)).sum())
        # Were q ignored (each draft treated as a point mass) acceptance would be sum(p q).
        assert acceptance - float(np.sum(p_first.probs_at(ids) * q_first.probs_at(ids))) > 0.2
    else:
        second_likeliest, _ = sorted(exact, key=exact.get)[-2]
        best_next = max((pair for pair in exact if pair[0] == second_likeliest), key=exact.get)
        drafter = PredictionDrafter(list(best_next))
        draft_joint = {best_next: 1.0}
        acceptance = p_first.prob_of(best_next[0])
    bound = tv_bound(runs, len(exact))
    assert tv_distance(draft_joint, exact) > 2 * bound, "accepting every draft would fail"
    sampled, first_accepted = sampled_first_two(target, prompt, drafter, params, runs)
    assert tv_distance(sampled, exact) <= bound
    # The first draft is accepted with probability sum(min(p, q)) (Hoeffding, 2e-6).
    assert abs(first_accepted - acceptance) <= math.sqrt(math.log(1e6) / (2 * runs))


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


# -- how a generation ends ----------------------------------------------------------------

SCRIPT = "the cat sat.\nend of story"


def scripted_policies(model: ScriptedTextModel) -> dict[str, FixedDraftPolicy]:
    """Plain, a perfect prediction (drafts run straight through any stop string),
    n-grams, and a draft model that is mostly wrong."""
    return {
        "plain": plain(),
        # EOS then more EOS: a loop that kept verifying after an accepted EOS would show.
        "exact_prediction_k8": FixedDraftPolicy(
            PredictionDrafter([*model.script_tokens, EOS, EOS, EOS]), 8
        ),
        "ngram_k4": FixedDraftPolicy(NgramDrafter(sizes=(2, 1), min_match=1), 4),
        "draft_model_k3": FixedDraftPolicy(ModelDrafter(draft_model_for(model)), 3),
    }


POLICY_NAMES = ("plain", "exact_prediction_k8", "ngram_k4", "draft_model_k3")


def generate_script(
    script: str, policy_name: str, **options: object
) -> tuple[ScriptedTextModel, GenerationRecord]:
    model = ScriptedTextModel(script)
    policy = scripted_policies(model)[policy_name]
    record = run_generation(model, chat_prompt(model, "tell me"), policy, GREEDY, **options)
    return model, record


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_end_of_generation_token_finishes_with_stop_and_is_not_shown(policy_name: str) -> None:
    model, record = generate_script(SCRIPT, policy_name, max_tokens=200)
    assert record.text == SCRIPT
    assert record.finish_reason == FINISH_STOP
    assert EOS not in record.tokens
    assert record.tokens == model.script_tokens
    assert_invariants(record, 8)


def test_an_accepted_end_of_generation_draft_ends_the_round() -> None:
    _, record = generate_script(SCRIPT, "exact_prediction_k8", max_tokens=200)
    last = record.events[-1]
    assert last.from_draft and all(last.from_draft), "EOS came in as an accepted draft"
    assert record.stats.accepted == sum(record.from_draft) + 1
    assert list(record.caches[-1]) == [*record.prompt, *record.tokens, EOS]


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
@pytest.mark.parametrize(
    ("stop", "shown"),
    [
        (["\nend"], "the cat sat."),  # a stop string over three tokens
        (["t s"], "the ca"),  # it starts inside the token "at"
        (["sat", "cat"], "the "),  # the earliest match wins
        (["the"], ""),  # at the very start
        (["nowhere"], SCRIPT),  # never matches: no effect
    ],
)
def test_stop_strings_are_never_shown_and_text_before_them_is(
    policy_name: str, stop: list[str], shown: str
) -> None:
    _, record = generate_script(SCRIPT, policy_name, stop=stop, max_tokens=200)
    # Shown text only ever grows, so their concatenation is everything a reader saw.
    assert record.text == shown
    assert record.finish_reason == FINISH_STOP
    assert_invariants(record, 8)


@pytest.mark.parametrize("policy_name", POLICY_NAMES[1:])
@pytest.mark.parametrize("stop", [["\nend"], ["t s"], ["sat", "cat"], ["the"], ["sat."]])
def test_a_stop_string_ends_the_reply_at_the_token_plain_decoding_ends_it(
    policy_name: str, stop: list[str]
) -> None:
    # Drafts accepted past the stop string are not the reply's: the usage counts and
    # the tokens are plain decoding's, however far the round ran.
    _, alone = generate_script(SCRIPT, "plain", stop=stop, max_tokens=200)
    _, record = generate_script(SCRIPT, policy_name, stop=stop, max_tokens=200)
    assert record.tokens == alone.tokens
    assert record.stats.generated_tokens == alone.stats.generated_tokens == len(alone.tokens)
    assert record.events[-1].stop_sequence == alone.events[-1].stop_sequence is not None


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_a_held_back_stop_prefix_is_released_when_the_stop_string_does_not_complete(
    policy_name: str,
) -> None:
    _, record = generate_script("the cat sat.\nen", policy_name, stop=["\nend"], max_tokens=200)
    assert record.text == "the cat sat.\nen"
    assert record.finish_reason == FINISH_STOP
    cut = len(ScriptedTextModel(SCRIPT).tokenize("the cat sat.\ne", add_special=False))
    _, record = generate_script(SCRIPT, policy_name, stop=["\nend"], max_tokens=cut)
    assert record.text == "the cat sat.\ne"  # cut by max_tokens inside the held prefix
    assert record.finish_reason == FINISH_LENGTH


@pytest.mark.parametrize("max_tokens", (1, 2, 5, 17, 40))
@pytest.mark.parametrize("draft_length", (0, 1, 3, 8))
def test_max_tokens_gives_exactly_that_many_tokens_and_finish_length(
    draft_length: int, max_tokens: int
) -> None:
    target = new_target(eos_bias=-np.inf)
    prompt = chat_prompt(target, PROMPTS[0])
    expected = run_generation(new_target(), prompt, plain(), GREEDY, max_tokens=60).tokens
    # A perfect prediction: every draft is accepted, so rounds emit K + 1 tokens.
    policy = FixedDraftPolicy(PredictionDrafter(expected), draft_length)
    record = run_generation(target, prompt, policy, GREEDY, max_tokens=max_tokens)
    assert len(record.tokens) == max_tokens
    assert record.tokens == expected[:max_tokens]
    assert record.finish_reason == FINISH_LENGTH
    assert_invariants(record, draft_length)


@pytest.mark.parametrize("draft_length", (0, 4))
def test_cancelling_between_rounds_finishes_with_cancelled_and_keeps_the_text(
    draft_length: int,
) -> None:
    target = new_target(eos_bias=-np.inf)
    prompt = chat_prompt(target, PROMPTS[0])
    cancel = threading.Event()
    seen: list[int] = []

    def cancel_after_two(event: GenerationEvent) -> None:
        seen.append(1)
        if len(seen) == 2:
            cancel.set()

    policy = FixedDraftPolicy(ModelDrafter(draft_model_for(target)), draft_length)
    record = run_generation(
        target, prompt, policy, GREEDY, max_tokens=500, cancel=cancel, on_event=cancel_after_two
    )
    assert len(record.events) == 3
    assert record.finish_reason == FINISH_CANCELLED
    assert record.events[-1].tokens == ()
    assert record.stats.rounds == 2
    expected = run_generation(new_target(), prompt, plain(), GREEDY, max_tokens=500)
    assert record.tokens == expected.tokens[: len(record.tokens)]
    decoded = b"".join(target.token_bytes(token) for token in record.tokens)
    assert record.text == decoded.decode("utf-8", errors="replace")
    assert_invariants(record, draft_length)


def test_cancelling_releases_text_held_back_for_a_stop_string() -> None:
    model = ScriptedTextModel(SCRIPT)
    cancel = threading.Event()

    def cancel_after_the_newline(event: GenerationEvent) -> None:
        if any(model.token_bytes(token) == b"\n" for token in event.tokens):
            cancel.set()

    record = run_generation(
        model,
        chat_prompt(model, "tell me"),
        plain(),
        GREEDY,
        stop=["\nend"],
        cancel=cancel,
        on_event=cancel_after_the_newline,
    )
    assert record.finish_reason == FINISH_CANCELLED
    assert record.text == "the cat sat.\n"


def test_cancelling_before_the_first_round_yields_one_empty_event() -> None:
    target = new_target()
    cancel = threading.Event()
    cancel.set()
    record = run_generation(target, chat_prompt(target, "hi"), plain(), GREEDY, cancel=cancel)
    assert len(record.events) == 1
    assert record.finish_reason == FINISH_CANCELLED
    assert record.text == "" and record.tokens == []
    assert target.forward_calls == 0


def test_a_prompt_that_fills_the_context_raises_context_overflow() -> None:
    target = new_target(n_ctx=16)
    for length in (16, 17, 40):
        with pytest.raises(ContextOverflowError, match="context"):
            next(
                speculative_generate(
                    target, [BOS] + [20] * (length - 1), policy=plain(), params=GREEDY, max_tokens=5
                )
            )
    assert target.forward_calls == 0 and target.prefill_calls == 0


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        next(speculative_generate(new_target(), [], policy=plain(), params=GREEDY, max_tokens=5))


@pytest.mark.parametrize("draft_length", (0, 1, 4, 8))
@pytest.mark.parametrize("kind", DRAFTER_KINDS)
def test_a_full_context_finishes_with_length_without_overflowing(
    kind: str, draft_length: int
) -> None:
    n_ctx = 48
    baseline_target = new_target(n_ctx=n_ctx, eos_bias=-np.inf)
    prompt = chat_prompt(baseline_target, PROMPTS[0])
    baseline = run_generation(baseline_target, prompt, plain(), GREEDY, max_tokens=1000)
    # Every position of the context is used; the last (pending) token is never evaluated.
    assert len(baseline.tokens) == n_ctx + 1 - len(prompt)
    target = new_target(n_ctx=n_ctx, eos_bias=-np.inf)
    expected = run_generation(new_target(), prompt, plain(), GREEDY, max_tokens=200).tokens
    drafter = make_drafter(kind, target, expected)
    record = run_generation(
        target, prompt, FixedDraftPolicy(drafter, draft_length), GREEDY, max_tokens=1000
    )
    assert record.finish_reason == FINISH_LENGTH
    assert record.tokens == baseline.tokens
    assert len(target.cached_tokens) == n_ctx
    assert_invariants(record, draft_length)


def test_a_prompt_one_short_of_the_context_still_generates() -> None:
    target = new_target(n_ctx=16, eos_bias=-np.inf)
    prompt = [BOS] + [20] * 14
    record = run_generation(target, prompt, plain(), GREEDY, max_tokens=10)
    assert record.finish_reason == FINISH_LENGTH
    assert len(record.tokens) == 2


# -- reusing the cache ----------------------------------------------------------------------


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", ("model", "ngram"))
def test_a_prompt_that_extends_the_last_one_reuses_the_cache_and_gives_the_same_output(
    kind: str, params: SamplingParams
) -> None:
    target = new_target()
    drafter = make_drafter(kind, target, [])
    policy = FixedDraftPolicy(drafter, 4)
    first_prompt = chat_prompt(target, PROMPTS[0])
    first = run_generation(target, first_prompt, policy, params, max_tokens=30)
    follow_up = [*first_prompt, *first.tokens, *target.tokenize("<|user|>and then<|assistant|>")]

    prefilled_before = target.prefill_token_count
    warm = run_generation(target, follow_up, policy, params, max_tokens=40)
    cold_target = new_target()
    cold = run_generation(
        cold_target,
        follow_up,
        FixedDraftPolicy(make_drafter(kind, cold_target, []), 4),
        params,
        max_tokens=40,
    )
    assert warm.stats.cached_prompt_tokens >= len(first_prompt) + len(first.tokens) - 1
    assert cold.stats.cached_prompt_tokens == 0
    assert target.prefill_token_count - prefilled_before < len(follow_up) - 1 - len(first_prompt)
    assert warm.tokens == cold.tokens and warm.text == cold.text
    assert_invariants(warm, 4)


def test_a_prompt_that_diverges_from_the_cache_reuses_only_the_common_prefix() -> None:
    target = new_target()
    first_prompt = chat_prompt(target, "the cat sat on the mat")
    run_generation(target, first_prompt, plain(), GREEDY, max_tokens=20)
    other_prompt = chat_prompt(target, "the cat ran away")
    shared = 0
    while first_prompt[shared] == other_prompt[shared]:
        shared += 1
    warm = run_generation(target, other_prompt, plain(), GREEDY, max_tokens=20)
    cold = run_generation(new_target(), other_prompt, plain(), GREEDY, max_tokens=20)
    assert warm.stats.cached_prompt_tokens == shared
    assert warm.tokens == cold.tokens


def test_the_same_prompt_twice_needs_no_prefill_and_gives_the_same_output() -> None:
    target = new_target()
    prompt = chat_prompt(target, PROMPTS[1])
    first = run_generation(target, prompt, plain(), SAMPLED, max_tokens=20)
    prefill_calls = target.prefill_calls
    again = run_generation(target, prompt, plain(), SAMPLED, max_tokens=20)
    assert again.stats.cached_prompt_tokens == len(prompt) - 1
    assert target.prefill_calls == prefill_calls
    assert again.tokens == first.tokens


# -- text ------------------------------------------------------------------------------------

MULTIBYTE_SCRIPT = "café é ü, été!"


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_a_character_split_across_tokens_is_never_shown_broken(policy_name: str) -> None:
    model, record = generate_script(MULTIBYTE_SCRIPT, policy_name, max_tokens=200)
    assert model.script_tokens.count(E_ACUTE_HEAD) == 4
    assert all("\ufffd" not in event.text for event in record.events)
    assert record.text == MULTIBYTE_SCRIPT
    if policy_name == "plain":
        # One token per event: some event ends between the two halves of "é".
        halfway = [event for event in record.events if event.tokens[-1:] == (E_ACUTE_HEAD,)]
        assert halfway and all(event.text in ("", "caf") for event in halfway[:1])


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("draft_length", (0, 1, 3))
def test_streamed_text_is_the_utf8_decoding_of_the_tokens(
    draft_length: int, params: SamplingParams
) -> None:
    target = new_target(eos_bias=-np.inf)
    prompt = chat_prompt(target, PROMPTS[0])
    policy = FixedDraftPolicy(ModelDrafter(draft_model_for(target)), draft_length)
    record = run_generation(target, prompt, policy, params, max_tokens=150)
    decoded = b"".join(target.token_bytes(token) for token in record.tokens).decode(
        "utf-8", errors="replace"
    )
    assert E_ACUTE_HEAD in record.tokens
    assert record.text == decoded
    body = record.events[:-1] if record.tokens[-1] == E_ACUTE_HEAD else record.events
    assert all("\ufffd" not in event.text for event in body)


class CancellingReader(HashModel):
    """A target whose reader cancels the generation after its first prefill slice."""

    def __init__(self, cancel: threading.Event, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.cancel = cancel

    def prefill(self, tokens: Sequence[int]) -> None:
        super().prefill(tokens)
        self.cancel.set()


def test_cancelling_while_the_prompt_is_read_stops_reading_and_keeps_what_was_read() -> None:
    # A client that leaves during a long prompt (an agent's, minutes on a CPU) frees the
    # engine after the slice being read; a retry of the prompt reads only the rest.
    cancel = threading.Event()
    target = CancellingReader(cancel, n_ctx=4 * PREFILL_SLICE, eos_bias=-np.inf)
    prompt = [BOS] + [4 + index % 50 for index in range(2 * PREFILL_SLICE)]
    record = run_generation(target, prompt, plain(), GREEDY, max_tokens=5, cancel=cancel)
    assert record.finish_reason == FINISH_CANCELLED
    assert record.tokens == [] and record.stats.rounds == 0
    assert target.prefill_calls == 1 and target.forward_calls == 0
    assert list(target.cached_tokens) == prompt[:PREFILL_SLICE]

    retry = run_generation(target, prompt, plain(), GREEDY, max_tokens=5, cancel=threading.Event())
    assert retry.stats.cached_prompt_tokens == PREFILL_SLICE
    assert target.prefill_token_count == len(prompt) - 1
    fresh = HashModel(n_ctx=4 * PREFILL_SLICE, eos_bias=-np.inf)
    expected = run_generation(fresh, prompt, plain(), GREEDY, max_tokens=5)
    assert retry.tokens == expected.tokens


class SliceRecorder(HashModel):
    """A target that records the size of every prefill call."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.slices: list[int] = []

    def prefill(self, tokens: Sequence[int]) -> None:
        super().prefill(tokens)
        self.slices.append(len(tokens))


@pytest.mark.parametrize("unread", (5, PREFILL_SLICE, PREFILL_SLICE + 6, 3 * PREFILL_SLICE - 1))
def test_a_prompt_is_read_in_equal_slices_none_of_them_a_stub(unread: int) -> None:
    # A recurrent target keeps a checkpoint where a prompt-sized prefill ends; a last
    # slice of a few tokens would put it short of the prompt's end.
    target = SliceRecorder(n_ctx=4 * PREFILL_SLICE, eos_bias=-np.inf)
    prompt = [BOS] + [4 + index % 50 for index in range(unread)]
    run_generation(target, prompt, plain(), GREEDY, max_tokens=1)
    assert sum(target.slices) == unread
    assert max(target.slices) <= PREFILL_SLICE
    assert max(target.slices) - min(target.slices) <= 1
