"""THE loop writes what plain decoding writes: greedy token for token, sampled in distribution.

Every run goes through ``speculative_generate`` with the strict fakes of
``tests/support/fakes.py`` (the fakes themselves are checked first).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from backends.base import Model
from backends.errors import DecodeError
from backends.sampling.filters import SamplingParams, distribution
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.prediction_drafter import PredictionDrafter
from backends.speculation.proposal import Drafter
from tests.speculation.loop_helpers import (
    DRAFTER_KINDS,
    GREEDY,
    PROMPTS,
    SAMPLED,
    make_drafter,
    new_target,
    plain,
)
from tests.support.fake_runs import GenerationRecord, chat_prompt, run_generation
from tests.support.fakes import EOS, HashModel, ScriptedTextModel, draft_model_for

DRAFT_LENGTHS = (1, 2, 4, 8)


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
