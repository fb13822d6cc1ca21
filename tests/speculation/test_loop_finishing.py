"""How THE loop ends a reply: end of generation, stop strings, max_tokens, cancelling, a
full context.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from backends.errors import ContextOverflowError
from backends.generation_events import (
    FINISH_CANCELLED,
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationEvent,
)
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.loop import speculative_generate
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.prediction_drafter import PredictionDrafter
from backends.speculation.reply_spec import ReplySpec
from tests.speculation.loop_helpers import (
    DRAFTER_KINDS,
    GREEDY,
    POLICY_NAMES,
    PROMPTS,
    assert_invariants,
    generate_script,
    make_drafter,
    new_target,
    plain,
)
from tests.support.fake_runs import chat_prompt, run_generation
from tests.support.fakes import BOS, EOS, ScriptedTextModel, draft_model_for

# -- how a generation ends ----------------------------------------------------------------

SCRIPT = "the cat sat.\nend of story"


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
                    target, [BOS] + [20] * (length - 1), plain(), ReplySpec(GREEDY, 5)
                )
            )
    assert target.forward_calls == 0 and target.prefill_calls == 0


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        next(speculative_generate(new_target(), [], plain(), ReplySpec(GREEDY, 5)))


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
