"""How THE loop reads a prompt and shows text: the cache reused across prompts, prompts
read in equal slices (and cancelled mid-read), characters never shown broken.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from backends.generation_events import (
    FINISH_CANCELLED,
)
from backends.sampling.filters import SamplingParams
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.loop import PREFILL_SLICE
from backends.speculation.model_drafter import ModelDrafter
from tests.speculation.loop_helpers import (
    GREEDY,
    POLICY_NAMES,
    PROMPTS,
    SAMPLED,
    assert_invariants,
    generate_script,
    make_drafter,
    new_target,
    plain,
)
from tests.support.fake_runs import chat_prompt, run_generation
from tests.support.fakes import BOS, E_ACUTE_HEAD, HashModel, draft_model_for

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
