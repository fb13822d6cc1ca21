"""The first token never waits for a drafter (issue 51, part 8).

A reply's first token is the target's own, sampled from the row that reading the prompt
ends on, and streamed at once: a draft model, whose cache follows the context lazily,
reads the prompt only in a later round that drafts with it, so a reply that ends at its
first token never makes it read anything. Driven by the fakes (no timing): what the
draft model has read is its cache, its forward and prefill counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.generation_events import FINISH_STOP
from backends.sampling.filters import SamplingParams
from backends.speculation.acceptance import AcceptanceEstimate
from backends.speculation.controller import AdaptiveDraftPolicy
from backends.speculation.draft_policy import FIRST_ROUND_REASON
from backends.speculation.loop import speculative_generate
from backends.speculation.model_drafter import READ_AS_PROMPT, ModelDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.reply_spec import LoopHooks, ReplySpec
from tests.speculation.held_costs import (
    GPU_COSTS,
    GPU_DRAFT_STEP,
    HeldCosts,
)
from tests.support.fakes import ASSISTANT, BOS, USER, HashModel, ScriptedTextModel, draft_model_for

GREEDY = SamplingParams()


def agent_prompt(length: int = 300) -> list[int]:
    """A chat prompt of ``length`` tokens of unrepeating text (no n-gram pays in it)."""
    rng = np.random.default_rng(5)
    body = [int(token) for token in rng.integers(6, 64, size=length - 3)]
    return [BOS, USER, *body, ASSISTANT]


def pair(target: HashModel | None = None) -> tuple[Engine, HashModel, HashModel]:
    """An engine over a fake pair whose figures and acceptance make `auto` draft with
    the draft model."""
    target = target or HashModel(n_ctx=1024, window=2, eos_bias=-4.0)
    draft = draft_model_for(target, noise_scale=0.3)
    engine = Engine(target, draft)
    engine.costs = HeldCosts(dict(GPU_COSTS), GPU_DRAFT_STEP)
    memory = {"model": AcceptanceEstimate(0.95)}
    memory.update({f"ngram:{n}": AcceptanceEstimate(0.0) for n in (2, 3, 4, 6, 8)})
    engine.use_acceptance_memory(memory)
    return engine, target, draft


def untouched(model: HashModel) -> bool:
    """The model has read nothing at all."""
    return model.cached_tokens == () and model.forward_calls == model.prefill_calls == 0


def test_the_first_token_comes_before_the_draft_model_reads_the_prompt() -> None:
    engine, _, draft = pair()
    prompt = agent_prompt()
    request = GenerationRequest(tuple(prompt), params=GREEDY, max_tokens=40, drafter="auto")
    events = engine.generate(request)
    first = next(events)
    assert len(first.tokens) == 1 and first.draft_length == 0 and first.drafter == "none"
    assert first.decision == FIRST_ROUND_REASON
    assert untouched(draft), "the draft model read something before the first token"
    rest = list(events)
    # Later rounds do draft with it: it read the prompt then, all but the pending
    # token in one go as a prompt is read (a parallel context reads that beside the
    # other sequences' rounds).
    assert any(event.drafter == "model" and event.draft_length for event in rest)
    assert draft.prefill_calls == 1 and draft.prefill_token_count >= len(prompt) > READ_AS_PROMPT
    assert draft.cached_tokens[: len(prompt)] == tuple(prompt)
    # And the reply is plain decoding's.
    plain_engine, _, _ = pair()
    plain = plain_engine.generate(
        GenerationRequest(tuple(prompt), params=GREEDY, max_tokens=40, drafter="none")
    )
    assert [t for e in [first, *rest] for t in e.tokens] == [t for e in plain for t in e.tokens]


@pytest.mark.parametrize("drafter", ["auto", "model"])
def test_a_reply_of_one_token_never_calls_the_draft_model(drafter: str) -> None:
    engine, _, draft = pair()
    request = GenerationRequest(tuple(agent_prompt()), params=GREEDY, max_tokens=1, drafter=drafter)
    events = list(engine.generate(request))
    assert sum(len(event.tokens) for event in events) == 1
    assert untouched(draft)


def test_a_reply_that_ends_at_its_first_token_never_calls_the_draft_model() -> None:
    # It writes nothing: its first token is the end of generation.
    engine, _, draft = pair(ScriptedTextModel("", n_ctx=1024, window=2))
    request = GenerationRequest(tuple(agent_prompt()), params=GREEDY, max_tokens=40)
    events = list(engine.generate(request))
    assert events[-1].finish_reason == FINISH_STOP and not any(e.tokens for e in events)
    assert untouched(draft)


def test_a_draft_model_that_holds_the_prompt_already_drafts_from_the_first_round() -> None:
    engine, _, draft = pair()
    prompt = agent_prompt()
    draft.prefill(prompt[:-1])  # as a kept conversation's state brings it back
    request = GenerationRequest(tuple(prompt), params=GREEDY, max_tokens=40)
    first = next(engine.generate(request))
    assert first.drafter == "model" and first.draft_length > 0


def test_a_fixed_draft_length_drafts_from_the_first_round() -> None:
    # `--drafter model` keeps its rounds whatever the draft model has read (so a
    # seeded sampled reply is the same text with its cache warm or cold).
    engine, _, draft = pair()
    request = GenerationRequest(
        tuple(agent_prompt()), params=GREEDY, max_tokens=40, drafter="model", draft_tokens=3
    )
    first = next(engine.generate(request))
    assert first.drafter == "model" and first.draft_length == 3
    assert draft.forward_calls > 0


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_the_overlapped_loop_keeps_the_first_round_plain_too(overlap: bool) -> None:
    target = HashModel(n_ctx=1024, window=2, eos_bias=-4.0)
    draft = draft_model_for(target, noise_scale=0.3)
    events = speculative_generate(
        target,
        agent_prompt(),
        auto_policy(draft, None),
        ReplySpec(GREEDY, 20),
        LoopHooks(overlap_drafting=overlap),
    )
    first = next(events)
    assert first.draft_length == 0 and first.decision == FIRST_ROUND_REASON
    assert untouched(draft)
    second = next(events)
    assert second.drafter == "model" and second.draft_length > 0


def auto_policy(draft: HashModel, max_reply_tokens: int | None) -> AdaptiveDraftPolicy:
    return AdaptiveDraftPolicy(
        [NgramDrafter(), ModelDrafter(draft)],
        HeldCosts(dict(GPU_COSTS), GPU_DRAFT_STEP),
        acceptance={"model": AcceptanceEstimate(0.95)},
        max_reply_tokens=max_reply_tokens,
    )


def drafts_with_model(policy: AdaptiveDraftPolicy, prompt: Sequence[int], written: int) -> bool:
    """Whether `auto` drafts with the draft model in the round after ``written`` tokens."""
    policy.begin(prompt)
    plan = policy.plan([*prompt, *([20] * written)])
    return plan.drafter is not None and plan.drafter.name == "model"


def test_a_catch_up_is_spread_over_no_more_tokens_than_the_reply_may_still_write() -> None:
    prompt = agent_prompt()
    target = HashModel(n_ctx=1024, window=2)
    draft = draft_model_for(target)
    # Reading the prompt pays over a long reply, not over the last few tokens of one.
    assert drafts_with_model(auto_policy(draft, None), prompt, written=1)
    assert drafts_with_model(auto_policy(draft, 1000), prompt, written=1)
    assert not drafts_with_model(auto_policy(draft, 4), prompt, written=1)
    assert not drafts_with_model(auto_policy(draft, 1000), prompt, written=997)
    # With nothing to read, a short reply drafts as well as a long one.
    draft.prefill(prompt)
    assert drafts_with_model(auto_policy(draft, 4), prompt, written=1)
