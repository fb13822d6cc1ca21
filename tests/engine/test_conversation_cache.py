"""The conversation cache over fake models: what is kept, what comes back, what is evicted.

The fakes' logits are a pure function of the context, so every answer can be compared
exactly with the same request on an engine that keeps nothing. Real runtimes are in
tests/runtimes/test_conversation_cache_real.py; the server's side in
tests/engine/test_server_conversation_cache.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from app.errors import SettingsError
from app.settings import (
    Settings,
    conversation_cache_bytes,
    parse_byte_size,
    settings_from_mapping,
)
from backends.base import SavesSequenceState
from backends.caches.conversation_cache import MIN_KEPT_TOKENS, MIN_RESTORE_GAIN, ConversationCache
from backends.engine import Engine, GenerationRequest
from backends.generation_events import SpeculativeStats
from backends.sampling.filters import SamplingParams
from tests.support.draftpen_cli import assert_clean_error, run_draftpen
from tests.support.fakes import EOS, HashModel, StatefulHashModel, draft_model_for

GREEDY = SamplingParams(temperature=0.0)
BYTES_PER_TOKEN = 100
MAX_TOKENS = 8


def user_turn(model: HashModel, text: str) -> list[int]:
    """Tokens of one user turn and the assistant's cue (no BOS)."""
    return model.tokenize(f"<|user|>{text}<|assistant|>", add_special=False)


def opening(model: HashModel, topic: str) -> list[int]:
    """A conversation's first prompt: BOS, a long shared system turn, then its own turn."""
    system = model.tokenize("<|user|>you are a helpful agent. " * 3, add_special=True)
    return system + user_turn(model, f"{topic} " * 6)


def turn(
    engine: Engine, prompt: Sequence[int], *, drafter: str = "none", max_tokens: int = MAX_TOKENS
) -> tuple[list[int], SpeculativeStats]:
    """One greedy generation: its tokens and final statistics."""
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        params=GREEDY,
        max_tokens=max_tokens,
        drafter=drafter,
        draft_tokens=3,
    )
    events = list(engine.generate(request))
    return [token for event in events for token in event.tokens], events[-1].stats


def follow_up(model: HashModel, prompt: list[int], reply: list[int], text: str) -> list[int]:
    """The next prompt of a conversation: what it had, the reply, a new user turn."""
    return prompt + reply + [EOS] + user_turn(model, text)


def kept_length(prompt: list[int], reply: list[int], stats: SpeculativeStats) -> int:
    """How much of the next prompt the cache holds after a turn: the prompt and the
    reply, less the reply's last token when the turn stopped at max_tokens (that token
    was emitted but never evaluated; a reply that ended at EOS had its last one read)."""
    ended_at_eos = stats.generated_tokens < MAX_TOKENS
    return len(prompt) + len(reply) - (0 if ended_at_eos else 1)


def engine_with_cache(budget: int = 10**6, **model_options: object) -> Engine:
    return Engine(StatefulHashModel(**model_options), conversations=ConversationCache(budget))


def test_the_fake_implements_the_capability_and_the_plain_fake_does_not() -> None:
    assert isinstance(StatefulHashModel(), SavesSequenceState)
    assert not isinstance(HashModel(), SavesSequenceState)


def test_a_conversation_left_for_another_comes_back_without_rereading() -> None:
    engine = engine_with_cache()
    plain = Engine(HashModel())  # keeps nothing: the answers to compare with
    target = engine.target
    assert isinstance(target, StatefulHashModel)

    agent = opening(target, "agent")
    agent_reply, agent_stats = turn(engine, agent)
    chat = opening(target, "chat")
    turn(engine, chat)
    agent_next = follow_up(target, agent, agent_reply, "go on")
    before = target.prefill_token_count
    reply, stats = turn(engine, agent_next)

    assert stats.cached_prompt_tokens == kept_length(agent, agent_reply, agent_stats)
    assert target.prefill_token_count - before == len(agent_next) - 1 - stats.cached_prompt_tokens
    assert target.restores == 1
    # The same answers as an engine that re-reads everything.
    plain_reply, _ = turn(plain, agent)
    assert plain_reply == agent_reply
    turn(plain, chat)
    plain_next, plain_stats = turn(plain, agent_next)
    assert plain_next == reply
    assert plain_stats.cached_prompt_tokens < len(agent)  # only the shared system turn
    figures = engine.conversations.stats() if engine.conversations else None
    assert figures is not None
    assert (figures.saved, figures.restored, figures.evicted) == (2, 1, 0)


def test_a_chat_that_goes_on_copies_nothing() -> None:
    engine = engine_with_cache()
    target = engine.target
    assert isinstance(target, StatefulHashModel)
    prompt = opening(target, "chat")
    for text in ("more", "and more", "once more"):
        reply, stats = turn(engine, prompt)
        prompt = follow_up(target, prompt, reply, text)
    assert stats.cached_prompt_tokens > 0
    assert (target.saves, target.restores) == (0, 0)


def test_the_closest_kept_conversation_is_the_one_restored() -> None:
    engine = engine_with_cache()
    target = engine.target
    assert isinstance(target, StatefulHashModel)
    first, second = opening(target, "first"), opening(target, "second")
    first_reply, first_stats = turn(engine, first)
    second_reply, second_stats = turn(engine, second)
    turn(engine, opening(target, "third"))
    _, stats = turn(engine, follow_up(target, second, second_reply, "next"))
    assert stats.cached_prompt_tokens == kept_length(second, second_reply, second_stats)
    _, stats = turn(engine, follow_up(target, first, first_reply, "next"))
    assert stats.cached_prompt_tokens == kept_length(first, first_reply, first_stats)


def test_the_least_recently_used_state_is_evicted_and_no_answer_changes() -> None:
    probe = StatefulHashModel()
    topics = ("alpha", "beta", "gamma", "delta")
    openings = {topic: opening(probe, topic) for topic in topics}
    longest = max(len(tokens) for tokens in openings.values()) + 8
    # Room for two kept conversations, not three.
    budget = int(2.5 * longest * BYTES_PER_TOKEN)
    engine = engine_with_cache(budget, bytes_per_token=BYTES_PER_TOKEN)
    plain = Engine(HashModel())
    cache = engine.conversations
    assert cache is not None

    def both(prompt: list[int]) -> tuple[list[int], SpeculativeStats]:
        tokens, stats = turn(engine, prompt)
        plain_tokens, _ = turn(plain, prompt)
        assert tokens == plain_tokens  # no answer changes, kept or evicted
        return tokens, stats

    replies = {}
    replies["alpha"], _ = both(openings["alpha"])
    replies["beta"], _ = both(openings["beta"])
    # Back to alpha: restored, so alpha is now more recently used than beta.
    alpha_next = follow_up(probe, openings["alpha"], replies["alpha"], "again")
    replies["alpha"], stats = both(alpha_next)
    assert stats.cached_prompt_tokens >= len(openings["alpha"])
    openings["alpha"] = alpha_next
    both(openings["gamma"])
    both(openings["delta"])  # keeping gamma's state overflows the budget: beta goes
    figures = cache.stats()
    assert figures.evicted == 1
    assert figures.used_bytes <= budget

    _, alpha_stats = both(follow_up(probe, openings["alpha"], replies["alpha"], "more"))
    assert alpha_stats.cached_prompt_tokens >= len(openings["alpha"])  # kept
    _, beta_stats = both(follow_up(probe, openings["beta"], replies["beta"], "again"))
    assert beta_stats.cached_prompt_tokens < len(openings["beta"])  # evicted: read again
    assert cache.stats().used_bytes <= budget


def test_small_gains_are_not_worth_a_copy() -> None:
    model = StatefulHashModel()
    cache = ConversationCache(10**6)
    base = opening(model, "shared start")
    kept = base + user_turn(model, "kept one " * 3)
    model.prefill(kept)
    # A prompt that would overwrite only a few tokens of the live cache: no copy.
    few = [*kept[: len(kept) - (MIN_KEPT_TOKENS - 1)], EOS]
    assert cache.prepare("target", model, few) == len(few) - 1
    assert model.saves == 0
    # A prompt that leaves most of it: the live state is kept.
    assert cache.prepare("target", model, [*base, EOS]) == len(base)
    assert model.saves == 1
    # Back to ``kept`` from a cache holding ``base`` plus a little: restored only when
    # the kept state shares at least MIN_RESTORE_GAIN more tokens than the live cache.
    model.rollback(len(base))
    model.prefill(kept[len(base) : len(kept) - MIN_RESTORE_GAIN + 1])
    assert cache.prepare("target", model, kept) == len(kept) - MIN_RESTORE_GAIN + 1
    assert model.restores == 0
    model.rollback(len(base))
    assert cache.prepare("target", model, kept) == len(kept)
    assert model.restores == 1
    assert list(model.cached_tokens) == kept


def test_with_room_for_one_state_a_restore_still_brings_the_conversation_back() -> None:
    probe = StatefulHashModel()
    agent, chat = opening(probe, "agent"), opening(probe, "chat")
    # Room for one state of these sizes, not two.
    budget = int(1.5 * (len(agent) + MAX_TOKENS) * BYTES_PER_TOKEN)
    engine = engine_with_cache(budget, bytes_per_token=BYTES_PER_TOKEN)
    plain = Engine(HashModel())
    reply, _ = turn(engine, agent)
    turn(engine, chat)  # keeps the agent's state
    agent_next = follow_up(probe, agent, reply, "go on")
    # Keeping the chat's state pushes the agent's out, but it is restored all the same.
    tokens, stats = turn(engine, agent_next)
    assert stats.cached_prompt_tokens >= len(agent)
    figures = engine.conversations.stats()  # type: ignore[union-attr]
    assert (figures.restored, figures.evicted) == (1, 1)
    assert figures.used_bytes <= budget
    turn(plain, agent)
    turn(plain, chat)
    assert tokens == turn(plain, agent_next)[0]


def test_a_state_larger_than_the_budget_is_never_kept() -> None:
    engine = engine_with_cache(budget=BYTES_PER_TOKEN * MIN_KEPT_TOKENS)
    target = engine.target
    turn(engine, opening(target, "long one"))  # type: ignore[arg-type]
    turn(engine, opening(target, "another"))  # type: ignore[arg-type]
    figures = engine.conversations.stats()  # type: ignore[union-attr]
    assert (figures.entries, figures.used_bytes, figures.evicted) == (0, 0, 1)


def test_a_zero_budget_keeps_nothing() -> None:
    engine = engine_with_cache(budget=0)
    target = engine.target
    assert isinstance(target, StatefulHashModel)
    turn(engine, opening(target, "one"))
    turn(engine, opening(target, "two"))
    assert target.saves == 0


def test_a_failed_restore_reads_the_prompt_and_answers_the_same() -> None:
    engine = engine_with_cache()
    target = engine.target
    assert isinstance(target, StatefulHashModel)
    plain = Engine(HashModel())
    agent = opening(target, "agent")
    reply, _ = turn(engine, agent)
    turn(engine, opening(target, "chat"))
    target.fail_restores = True
    agent_next = follow_up(target, agent, reply, "go on")
    tokens, stats = turn(engine, agent_next)
    assert stats.cached_prompt_tokens == 0
    turn(plain, agent)
    turn(plain, opening(target, "chat"))
    assert tokens == turn(plain, agent_next)[0]
    assert engine.conversations is not None
    assert engine.conversations.stats().failed == 1


def test_a_model_that_cannot_save_its_state_is_left_alone() -> None:
    engine = Engine(HashModel(), conversations=ConversationCache(10**6))
    target = engine.target
    agent = opening(target, "agent")  # type: ignore[arg-type]
    reply, _ = turn(engine, agent)
    turn(engine, opening(target, "chat"))  # type: ignore[arg-type]
    _, stats = turn(engine, follow_up(target, agent, reply, "go on"))  # type: ignore[arg-type]
    assert stats.cached_prompt_tokens < len(agent)
    assert engine.conversations is not None
    assert engine.conversations.stats().entries == 0


def test_the_draft_models_cache_is_kept_when_the_request_drafts_with_it() -> None:
    target = StatefulHashModel()
    draft = StatefulHashModel(name="hash-draft", noise_scale=1.0)
    engine = Engine(target, draft, conversations=ConversationCache(10**6))
    plain = Engine(HashModel(), draft_model_for(HashModel()))
    agent = opening(target, "agent")
    reply, _ = turn(engine, agent, drafter="model")
    turn(engine, opening(target, "chat"), drafter="model")
    draft_calls_before = draft.prefill_token_count + sum(draft.forward_batch_sizes)
    agent_next = follow_up(target, agent, reply, "go on")
    tokens, _ = turn(engine, agent_next, drafter="model")
    assert draft.restores == 1
    # The draft read the new turn, not the whole conversation again.
    draft_read = draft.prefill_token_count + sum(draft.forward_batch_sizes) - draft_calls_before
    assert draft_read < len(agent)
    turn(plain, agent, drafter="model")
    turn(plain, opening(target, "chat"), drafter="model")
    assert tokens == turn(plain, agent_next, drafter="model")[0]


def test_a_request_that_does_not_draft_with_the_model_leaves_its_cache_alone() -> None:
    target = StatefulHashModel()
    draft = StatefulHashModel(name="hash-draft", noise_scale=1.0)
    engine = Engine(target, draft, conversations=ConversationCache(10**6))
    agent = opening(target, "agent")
    turn(engine, agent, drafter="model")
    turn(engine, opening(target, "chat"), drafter="ngram")
    assert (draft.saves, draft.restores) == (0, 0)
    assert target.saves == 1


def test_a_state_goes_back_only_into_the_model_that_saved_it() -> None:
    first, second = StatefulHashModel(), StatefulHashModel()
    first.prefill(opening(first, "agent"))
    with pytest.raises(ValueError, match="another model"):
        second.restore_state(first.save_state())


def test_closing_the_engine_frees_what_it_kept() -> None:
    engine = engine_with_cache()
    turn(engine, opening(engine.target, "one"))  # type: ignore[arg-type]
    turn(engine, opening(engine.target, "two"))  # type: ignore[arg-type]
    cache = engine.conversations
    assert cache is not None and cache.stats().entries == 1
    engine.close()
    assert (cache.stats().entries, cache.stats().used_bytes) == (0, 0)


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="0 bytes or more"):
        ConversationCache(-1)


# -- the setting ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("1500000000", 1_500_000_000),
        ("2GiB", 2 << 30),
        ("2 G", 2 << 30),
        ("512MB", 512 * 10**6),
        ("1.5gib", int(1.5 * (1 << 30))),
        ("64k", 64 << 10),
        (" Auto ", "auto"),
    ],
)
def test_sizes_are_read_as_people_write_them(text: str, size: int | str) -> None:
    assert parse_byte_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1G", "2 parsecs", "nan", "inf", "1e999"])
def test_what_is_not_a_size_is_refused(text: str) -> None:
    assert parse_byte_size(text) is None


def test_auto_is_an_eighth_of_the_machines_ram() -> None:
    assert conversation_cache_bytes("auto", total_ram=16 << 30) == 2 << 30
    assert conversation_cache_bytes("auto") > 0
    assert conversation_cache_bytes("300MiB") == 300 << 20
    assert Settings().conversation_cache == "auto"


def test_a_bad_setting_names_the_accepted_forms() -> None:
    with pytest.raises(SettingsError, match=r'conversation_cache must be "auto", "0" \(off\)'):
        settings_from_mapping({"conversation_cache": "plenty"})
    assert settings_from_mapping({"conversation_cache": "1GiB"}).conversation_cache == "1GiB"


def test_serve_refuses_a_bad_cache_size_in_one_line() -> None:
    result = run_draftpen("serve", "--pair", "smollm2", "--conversation-cache", "plenty")
    assert_clean_error(result, "--conversation-cache", '"2GiB"')
