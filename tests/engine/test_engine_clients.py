"""Front ends as clients of one real engine process: ``app.client`` and openai-SDK
clients at once share one load, wait their turn, answer as each alone; keep_alive
unloads an idle pair; ``bench --engine`` runs its suite as requests.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from app.client import (
    ChatTurn,
    EngineClient,
    Loading,
    Waiting,
    ensure_engine,
)
from app.settings import Settings
from backends.base import ChatMessage
from backends.generation_events import GenerationEvent
from tests.support.draftpen_cli import run_draftpen
from tests.support.engine_fixtures import wait_until
from tests.support.engine_process import (
    COUNTING,
    GREEDY,
    PAIR,
    chat_text,
    sdk,
    sdk_chat,
    short_socket,
    stop_engine,
)
from tests.support.model_files import SMOLLM2_KEY, require_model


def chat_turn(text: str, max_tokens: int = 24) -> ChatTurn:
    return ChatTurn(
        PAIR,
        (ChatMessage("user", text),),
        GREEDY,
        max_tokens=max_tokens,
        drafter="ngram",
        draft_tokens=4,
    )


# -- a real engine with SmolLM2 ----------------------------------------------------------


def rss(pid: int) -> int:
    """A process's resident memory, in bytes."""
    return psutil.Process(pid).memory_info().rss


def engine_rss(client: EngineClient) -> int:
    """The engine's resident memory: its front process and its runtime process."""
    health = client.health()
    runtime = health.runtime.pid if health.runtime is not None else None
    return rss(health.pid) + (rss(runtime) if runtime is not None else 0)


@pytest.mark.real_model
def test_chat_and_an_openai_client_at_once_share_one_load(engine: EngineClient):
    model_bytes = require_model(SMOLLM2_KEY).stat().st_size
    assert {card.id: card.loaded for card in engine.pairs()}.get(PAIR) is False
    empty = engine_rss(engine)

    def chat(client: EngineClient) -> list[Any]:
        return list(client.chat(chat_turn("Name a colour.")))

    with ThreadPoolExecutor(max_workers=2) as pool:
        chatted = pool.submit(chat, engine)
        answered = pool.submit(sdk_chat, sdk(engine), "Name a fruit.")
        items, answer = chatted.result(timeout=300), answered.result(timeout=300)
    grown_together = engine_rss(engine) - empty

    assert chat_text(items) and answer
    # One of them loaded the pair while the other waited; the chat saw either.
    assert any(isinstance(item, Loading | Waiting) for item in items)
    health = engine.health()
    assert [pair.pair for pair in health.loaded] == [PAIR] and health.loads == 1
    loaded = [card.id for card in engine.pairs() if card.loaded]
    assert loaded == [PAIR]

    # The memory of one pair: what an engine grows by when it loads the pair once and
    # answers the same two requests one after the other. A second copy of the pair
    # would add its weights and its KV cache again (about as much once more).
    alone = ensure_engine(
        Settings(), socket_path=short_socket("rss-alone"), serve_options=["--keep-alive", "-1"]
    )
    try:
        front = alone.health().pid
        alone_empty, front_empty = engine_rss(alone), rss(front)
        assert chat_text(chat(alone)) and sdk_chat(sdk(alone), "Name a fruit.")
        grown_alone = engine_rss(alone) - alone_empty
        # The weights are in the runtime process alone: the front loads no model.
        assert rss(front) - front_empty < 0.5 * model_bytes
    finally:
        stop_engine(alone)
    assert grown_alone > 0.8 * model_bytes  # the weights, read by every forward, are resident
    assert grown_together < 1.5 * grown_alone, (grown_together, grown_alone)


@pytest.fixture
def one_at_a_time(engine_home: Path, request: pytest.FixtureRequest) -> Iterator[EngineClient]:
    """An engine that generates one request at a time (``--parallel 1``), stopped after."""
    path = short_socket(request.node.name[:40])
    options = ["--keep-alive", "-1", "--parallel", "1"]
    client = ensure_engine(Settings(), socket_path=path, serve_options=options)
    try:
        yield client
    finally:
        stop_engine(client)


@pytest.mark.real_model
def test_a_waiting_chat_sees_what_it_waits_behind_then_runs(one_at_a_time: EngineClient):
    # One at a time: a chat waits behind an agent (with several, it runs beside it:
    # tests/engine/test_parallel_serve.py).
    engine = one_at_a_time
    require_model(SMOLLM2_KEY)
    engine.load(PAIR)
    transport = httpx.HTTPTransport(uds=str(engine.socket_path))
    holder = httpx.Client(transport=transport, base_url="http://draftpen", timeout=120)
    items: list[Any] = []
    request = {**COUNTING, "max_tokens": 3000, "stream": True, "speculative": {"drafter": "none"}}
    with holder, holder.stream("POST", "/v1/completions", json=request) as held:
        lines = held.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # generating now
        waiter = threading.Thread(target=lambda: items.extend(engine.chat(chat_turn("Say hi."))))
        waiter.start()
        wait_until(lambda: any(isinstance(item, Waiting) for item in items), "a queue notice")
    # Leaving the block abandons the agent's stream: the engine cancels it, the chat runs.
    waiter.join(120)
    assert items[0] == Waiting(1, ("agent request (smollm2)",))
    assert chat_text(items)
    assert [item for item in items if isinstance(item, GenerationEvent)][-1].finish_reason


@pytest.mark.real_model
def test_many_openai_clients_and_a_chat_at_once_answer_as_each_alone(
    one_at_a_time: EngineClient,
):
    # Queued one at a time, each answer is its answer alone to the token. Several at
    # once on fast kernels part at near-ties (tests/engine/test_server.py); under exact kernels
    # they do not (tests/engine/test_parallel_serve.py).
    engine = one_at_a_time
    require_model(SMOLLM2_KEY)
    topics = ["rivers", "owls", "tea"]
    client = sdk(engine)
    alone = [sdk_chat(client, f"One sentence about {topic}.") for topic in topics]
    chat_alone = chat_text(list(engine.chat(chat_turn("One sentence about maps."))))
    assert len(set(alone)) == len(topics) and chat_alone

    with ThreadPoolExecutor(max_workers=len(topics) + 1) as pool:
        chatted = pool.submit(
            lambda: chat_text(list(engine.chat(chat_turn("One sentence about maps."))))
        )
        together = list(pool.map(lambda t: sdk_chat(client, f"One sentence about {t}."), topics))
        assert chatted.result(timeout=300) == chat_alone
    assert together == alone
    assert engine.health().loads == 1


@pytest.mark.real_model
def test_keep_alive_unloads_the_idle_pair(engine_home: Path):
    require_model(SMOLLM2_KEY)
    path = short_socket("keepalive")
    client = ensure_engine(Settings(), socket_path=path, serve_options=["--keep-alive", "1s"])
    try:
        assert sdk_chat(sdk(client), "Hello!", max_tokens=4)
        assert client.health().keep_alive_seconds == 1.0
        wait_until(lambda: client.health().loaded == [], "keep-alive to unload", seconds=30)
        assert not any(card.loaded for card in client.pairs())
        assert sdk_chat(sdk(client), "Hello again!", max_tokens=4)  # loaded once more
        assert client.health().loads == 2
    finally:
        stop_engine(client)


@pytest.mark.real_model
def test_bench_through_the_engine_runs_the_suite_as_requests_and_reads_their_stats(
    engine: EngineClient, tmp_path: Path
):
    require_model(SMOLLM2_KEY)  # the engine runs, idle, nothing loaded
    output = tmp_path / "through-engine.json"
    result = run_draftpen(
        "bench",
        "--engine",
        "--pair",
        "smollm2",
        "--max-tokens",
        "16",
        "--category",
        "code_edit",
        "--category",
        "json_schema",
        "--modes",
        "ngram,reference",
        "--output",
        str(output),
        env={"DRAFTPEN_SOCKET": str(engine.socket_path)},
    )
    assert result.returncode == 0, result.stderr
    health = engine.health()
    report = json.loads(output.read_text())
    # It used the engine that ran (nothing was loaded in bench's own process) ...
    assert "Starting the draftpen engine" not in result.stderr
    assert report["through"]["process"] == "engine" and report["through"]["pid"] == health.pid
    assert [pair.pair for pair in health.loaded] == ["smollm2"] and health.loads == 1
    assert "left out with --engine" in result.stderr  # the yardsticks need a local pair
    assert report["costs_ms"] is None and "Through the engine" in result.stdout
    # ... which did the load and answered every generation: one untimed warm-up per mode
    # that applies to the first prompt (plain, n-gram), then each mode on each prompt of
    # both categories.
    code_edit, json_schema = report["results"]["code_edit"], report["results"]["json_schema"]
    assert set(code_edit) == {"plain", "n-gram K=10"}
    assert set(json_schema) == {"plain", "plain, no grammar", "n-gram K=10"}
    assert health.queue.completed == 1 + 2 + 2 * len(code_edit) + 2 * len(json_schema)
    # The figures are the loop's, from the stream's statistics.
    for by_mode in (code_edit, json_schema):
        for label, figures in by_mode.items():
            assert figures["generated_tokens"] > 0 and figures["decode_seconds"] > 0, label
            assert len(figures["run_rates"]) == 2
    assert code_edit["n-gram K=10"]["drafted"] > 0 and code_edit["plain"]["drafted"] == 0
    # The schema reached the engine as response_format: its grammar forced tokens.
    assert json_schema["plain"]["grammar_forced"] > 0
    assert json_schema["plain, no grammar"]["grammar_forced"] == 0
