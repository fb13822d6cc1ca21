"""Keeping conversations on real runtimes: llama.cpp's per-sequence state and MLX's cache.

Real models (marked ``real_model``). SmolLM2 carries the save/restore mechanics and the
eviction test on both runtimes; the starter pair (target and draft) carries a kept
conversation through the whole engine on llama.cpp.

The histories here are fixed text, as an agent resends its own transcript. Two
yardsticks: ``without_interruption`` runs the conversation's turns back to back on the
same models with nothing kept (the live cache carries one turn to the next), which a
restored state must match bit for bit; ``alone`` reads the whole prompt from an empty
cache, as a request made alone does.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from backends.base import ChatMessage, Model, SavesSequenceState
from backends.caches.conversation_cache import ConversationCache
from backends.engine import Engine, GenerationRequest
from backends.generation_events import SpeculativeStats
from backends.sampling.filters import SamplingParams
from tests.support.model_files import DRAFT_KEY, SMOLLM2_KEY, TARGET_KEY
from tests.support.real_runtimes import load_model

pytestmark = pytest.mark.real_model

SYSTEM = ChatMessage(
    "system", "You are a careful assistant. Answer briefly and plainly, in one sentence."
)


def conversation(topic: str, turns: int) -> list[ChatMessage]:
    """A fixed conversation about ``topic`` with ``turns`` user turns (and fixed replies)."""
    messages = [SYSTEM]
    for index in range(turns):
        if index:
            messages.append(ChatMessage("assistant", f"Here is part {index} about {topic}."))
        messages.append(ChatMessage("user", f"Tell me one more fact about {topic} ({index})."))
    return messages


def greedy(
    engine: Engine, messages: list[ChatMessage], **options: object
) -> tuple[str, SpeculativeStats]:
    """Text and final statistics of a greedy reply."""
    request = GenerationRequest(
        prompt_tokens=tuple(engine.chat_prompt(messages)),
        params=SamplingParams(temperature=0.0),
        **options,  # type: ignore[arg-type]
    )
    events = list(engine.generate(request))
    return "".join(event.text for event in events), events[-1].stats


def alone(engine: Engine, messages: list[ChatMessage], **options: object) -> str:
    """The reply to a request made alone: every cache emptied first, nothing kept."""
    kept = engine.conversations
    engine.conversations = None
    engine.target.rollback(0)
    if engine.draft is not None:
        engine.draft.rollback(0)
    try:
        return greedy(engine, messages, **options)[0]
    finally:
        engine.conversations = kept


def without_interruption(engine: Engine, turns: list[list[ChatMessage]], **options: object) -> str:
    """The last turn's reply when a conversation's turns run back to back, nothing kept."""
    kept = engine.conversations
    engine.conversations = None
    engine.target.rollback(0)
    if engine.draft is not None:
        engine.draft.rollback(0)
    try:
        replies = [greedy(engine, messages, **options)[0] for messages in turns]
        return replies[-1]
    finally:
        engine.conversations = kept


@pytest.fixture(scope="module", params=["llamacpp", "mlx"])
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def smollm2(runtime: str) -> Iterator[Model]:
    model = load_model(runtime, SMOLLM2_KEY)
    yield model
    model.close()


def test_a_restored_state_computes_the_same_logits_bit_for_bit(smollm2: Model) -> None:
    model = smollm2
    assert isinstance(model, SavesSequenceState)
    kept = model.tokenize("The quick brown fox jumps over the lazy dog. " * 4)
    other = model.tokenize("Completely different text about databases and indexes. " * 3)
    model.rollback(0)
    model.prefill(kept[:-1])
    state = model.save_state()
    assert state.tokens == tuple(kept[:-1])
    assert state.nbytes > 0
    expected = model.forward(kept[-1:])[0].copy()

    model.rollback(0)
    model.prefill(other)
    model.restore_state(state)
    assert list(model.cached_tokens) == kept[:-1]
    assert np.array_equal(model.forward(kept[-1:])[0], expected)

    # The live cache writing over the same positions must not reach the saved copy.
    model.rollback(len(kept) - 10)
    model.forward(other[:12])
    model.restore_state(state)
    assert np.array_equal(model.forward(kept[-1:])[0], expected)
    model.rollback(0)


def test_a_state_goes_back_only_into_the_model_that_saved_it(smollm2: Model, runtime: str) -> None:
    assert isinstance(smollm2, SavesSequenceState)
    smollm2.rollback(0)
    smollm2.prefill(smollm2.tokenize("a few tokens of context"))
    state = smollm2.save_state()
    other = load_model(runtime, SMOLLM2_KEY)
    try:
        assert isinstance(other, SavesSequenceState)
        with pytest.raises(ValueError, match="another model"):
            other.restore_state(state)
        assert list(other.cached_tokens) == []
    finally:
        other.close()
        smollm2.rollback(0)


def test_evictions_under_a_tiny_budget_change_no_answer(smollm2: Model, runtime: str) -> None:
    # Room for about one kept conversation: with three taking turns, states are evicted.
    smollm2.rollback(0)
    smollm2.prefill(smollm2.tokenize(smollm2.apply_chat_template(conversation("tea", 2))))
    assert isinstance(smollm2, SavesSequenceState)
    one_state = smollm2.save_state().nbytes
    smollm2.rollback(0)
    engine = Engine(smollm2, conversations=ConversationCache(int(1.5 * one_state)))
    options = {"drafter": "none", "max_tokens": 6 if runtime == "mlx" else 12}
    topics = ("tea", "rivers", "clocks")
    replies: dict[tuple[str, int], str] = {}
    for turns in (1, 2):
        for topic in topics:
            replies[topic, turns], _ = greedy(engine, conversation(topic, turns), **options)
    figures = engine.conversations.stats()  # type: ignore[union-attr]
    assert figures.evicted >= 1
    assert figures.used_bytes <= figures.budget_bytes
    for (topic, turns), reply in replies.items():
        assert reply == alone(engine, conversation(topic, turns), **options), (topic, turns)
    smollm2.rollback(0)


def test_a_kept_conversation_comes_back_through_the_engine_on_smollm2(
    smollm2: Model, runtime: str
) -> None:
    smollm2.rollback(0)
    engine = Engine(smollm2, conversations=ConversationCache(1 << 30))
    options = {"drafter": "none", "max_tokens": 6 if runtime == "mlx" else 12}
    agent_first = conversation("volcanoes", 1)
    greedy(engine, agent_first, **options)
    greedy(engine, conversation("bread", 1), **options)
    agent_next = conversation("volcanoes", 2)
    reply, stats = greedy(engine, agent_next, **options)
    # The whole first prompt came back (the second shares all of it but its last token).
    assert stats.cached_prompt_tokens >= len(engine.chat_prompt(agent_first)) - 1
    assert engine.conversations is not None
    assert engine.conversations.stats().restored >= 1
    assert reply == without_interruption(engine, [agent_first, agent_next], **options)
    smollm2.rollback(0)


@pytest.fixture(scope="module")
def starter_engine() -> Iterator[Engine]:
    target = load_model("llamacpp", TARGET_KEY)
    draft = load_model("llamacpp", DRAFT_KEY)
    engine = Engine(target, draft, conversations=ConversationCache(1 << 30))
    yield engine
    engine.close()


def test_the_starter_pair_keeps_target_and_draft_state_and_answers_the_same(
    starter_engine: Engine,
) -> None:
    engine = starter_engine
    options = {"drafter": "model", "draft_tokens": 3, "max_tokens": 16}
    agent_first = conversation("sorting algorithms", 1)
    greedy(engine, agent_first, **options)
    greedy(engine, conversation("gardening", 1), **options)
    agent_next = conversation("sorting algorithms", 2)
    reply, stats = greedy(engine, agent_next, **options)
    assert stats.cached_prompt_tokens >= len(engine.chat_prompt(agent_first)) - 1
    figures = engine.conversations.stats()  # type: ignore[union-attr]
    # Target and draft each kept the first conversation and brought it back.
    assert figures.saved >= 2
    assert figures.restored == 2
    assert reply == without_interruption(engine, [agent_first, agent_next], **options)
