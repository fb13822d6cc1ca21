"""Interleaved conversations through the real engine: each keeps its cache.

``draftpen serve`` (SmolLM2) as a subprocess on a Unix socket, the official openai SDK
as the client: an agent's conversation and a chat take turns, and the second request
of each reports (in OpenAI's usage and in the ``draftpen`` statistics) that its
history came from the cache. The same turns against an engine that keeps nothing show
what the cache spares, and that no answer changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.engine.conversations import (
    SYSTEM,
    Turn,
    ask,
    fixed_conversation,
)
from tests.support.serve_process import RunningServer, start_server

pytestmark = pytest.mark.real_model


def next_turn(turn: Turn, text: str) -> list[dict[str, str]]:
    """The conversation so far, the reply, and a new user message."""
    return [
        *turn.messages,
        {"role": "assistant", "content": turn.reply},
        {"role": "user", "content": text},
    ]


def interleave(server: RunningServer) -> dict[str, Turn]:
    """An agent's conversation and a chat taking turns: agent, chat, agent, chat."""
    client = server.openai()
    turns: dict[str, Turn] = {}
    turns["agent 1"] = ask(
        client, [SYSTEM, {"role": "user", "content": "List the planets of the solar system."}]
    )
    turns["chat 1"] = ask(client, [SYSTEM, {"role": "user", "content": "What is bread made of?"}])
    turns["agent 2"] = ask(client, next_turn(turns["agent 1"], "Which one is the largest?"))
    turns["chat 2"] = ask(client, next_turn(turns["chat 1"], "And how long does it bake?"))
    return turns


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DRAFTPEN_HOME for both servers, so the cost calibration is measured once."""
    return tmp_path_factory.mktemp("cache-home")


@pytest.fixture(scope="module")
def kept(home: Path) -> Iterator[tuple[dict[str, Turn], dict[str, Any]]]:
    """The turns against an engine keeping conversations, and its /health afterwards."""
    server = start_server(home, home / "kept.sock", "--conversation-cache", "256MiB")
    try:
        turns = interleave(server)
        yield turns, server.health()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def unkept(home: Path) -> Iterator[dict[str, Turn]]:
    """The same turns against an engine that keeps nothing."""
    server = start_server(home, home / "unkept.sock", "--conversation-cache", "0")
    try:
        yield interleave(server)
        assert server.health()["loaded"][0]["conversation_cache"] is None
    finally:
        server.stop()


def test_the_second_request_of_each_conversation_reads_only_its_new_turn(
    kept: tuple[dict[str, Turn], dict[str, Any]],
) -> None:
    turns, _ = kept
    for name in ("agent", "chat"):
        first, second = turns[f"{name} 1"], turns[f"{name} 2"]
        # Its whole history came from the cache: the first prompt and the reply (the
        # reply's last token may be the one never evaluated, when it stopped at max_tokens).
        history = first.prompt_tokens + first.completion_tokens - 1
        assert second.cached_tokens >= history, (name, second, first)
        assert second.cached_tokens < second.prompt_tokens
        assert second.stats_cached_tokens == second.cached_tokens


def test_health_counts_what_the_cache_kept_and_brought_back(
    kept: tuple[dict[str, Turn], dict[str, Any]],
) -> None:
    _, health = kept
    figures = health["loaded"][0]["conversation_cache"]
    assert figures["budget_bytes"] == 256 << 20
    assert figures["saved"] >= 3  # agent 1, chat 1, agent 2 were each left for the other
    assert figures["restored"] == 2
    assert 0 < figures["used_bytes"] <= figures["budget_bytes"]
    assert figures["evicted"] == 0


def test_without_the_cache_each_return_rereads_its_history_and_answers_the_same(
    kept: tuple[dict[str, Turn], dict[str, Any]], unkept: dict[str, Turn]
) -> None:
    turns, _ = kept
    for name in ("agent 2", "chat 2"):
        # Only the shared system turn was still in the one live cache.
        assert unkept[name].cached_tokens < turns[name.replace("2", "1")].prompt_tokens
        assert unkept[name].reply == turns[name].reply


def test_many_clients_at_once_under_a_tiny_budget_evict_and_change_no_answer(
    home: Path,
) -> None:
    topics = ("tea", "rivers", "clocks")
    requests = [fixed_conversation(topic, turns) for turns in (1, 2) for topic in topics]
    # Room for about one SmolLM2 conversation of this length: states must be evicted.
    # One sequence: the clients take turns on it, so every turn comes back to a cache
    # another conversation overwrote (and the answers compare to the token: batched
    # beside others, fast kernels may round a near-tie the other way).
    one = ("--parallel", "1")
    server = start_server(home, home / "tiny.sock", "--conversation-cache", "2MiB", *one)
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            # Each client sends its conversation's turns in order; the clients interleave.
            def client(topic: str) -> list[Turn]:
                sdk = server.openai()
                return [ask(sdk, fixed_conversation(topic, turns), 12) for turns in (1, 2)]

            answers = dict(zip(topics, pool.map(client, topics), strict=True))
        figures = server.health()["loaded"][0]["conversation_cache"]
    finally:
        server.stop()
    # Whether any state survives until its conversation returns depends on how the
    # clients interleave (round robin over three thrashes a cache with room for one):
    # what must hold is the budget, the evictions and the answers.
    assert figures["saved"] >= 1 and figures["evicted"] >= 1
    assert figures["used_bytes"] <= figures["budget_bytes"] == 2 << 20
    # Each answer equals the same request made alone, on an engine that keeps nothing.
    alone = start_server(home, home / "alone.sock", "--conversation-cache", "0", *one)
    try:
        sdk = alone.openai()
        for messages in requests:
            topic = messages[1]["content"].split("about ")[1].split(" (")[0]
            turns = sum(message["role"] == "user" for message in messages)
            assert ask(sdk, messages, 12).reply == answers[topic][turns - 1].reply, messages
    finally:
        alone.stop()
