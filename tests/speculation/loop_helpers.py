"""What the loop's tests share: the fake pairs, plain decoding to compare with, and the
invariants every event of a run must keep.

The models come from ``tests/support/fakes.py``, which are strict the way a runtime is:
they raise past ``n_ctx`` and overwrite the logits they returned on the next call, so a
loop that evaluates too much or reads stale logits fails its tests.
"""

from __future__ import annotations

from itertools import pairwise

from backends.generation_events import (
    FINISH_STOP,
    GenerationEvent,
    SpeculativeStats,
)
from backends.sampling.filters import SamplingParams
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.prediction_drafter import PredictionDrafter
from backends.speculation.proposal import Drafter
from tests.support.fake_runs import GenerationRecord, chat_prompt, run_generation
from tests.support.fakes import BOS, EOS, HashModel, ScriptedTextModel, draft_model_for

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
PROMPTS = ("the cat sat on the mat", "is this a test, 42 is the answer!")
DRAFTER_KINDS = ("model", "ngram", "prediction")


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
