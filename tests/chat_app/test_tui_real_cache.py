"""Many openai-SDK clients and a pilot-driven chat at once on one real engine under a tiny
conversation cache: evictions happen, the budget holds, every answer equals the same
request made alone.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.chats.history import COMPLETE, History
from tests.engine.conversations import Turn, ask, assert_as_alone, fixed_conversation
from tests.support.engine_process import (
    sdk,
    short_socket,
)
from tests.support.real_engine_app import (
    StartedEngines,
    chat_settings,
    make_real_app,
    wait_for,
)
from tests.support.serve_process import start_server
from tests.support.tui_helpers import send

pytestmark = pytest.mark.real_model


def test_many_openai_clients_and_the_chat_app_at_once_under_a_tiny_cache_answer_as_alone(
    engines: StartedEngines, engine_home: Path, tmp_path: Path
) -> None:
    # Room for about one short SmolLM2 conversation: kept states must be evicted.
    # One sequence: turns take turns on one cache, and answers compare to the token.
    engines.serve_options = ("--conversation-cache", "2MiB", "--parallel", "1")
    app = make_real_app(engines, chat_settings(max_tokens=24), tmp_path / "history.sqlite3")
    topics = ("tea", "rivers", "clocks")
    chat_turns = ("Name three colours.", "And three fruits?")

    async def body() -> dict[str, list[Turn]]:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready, "the pair to load", 180)
            openai_client = sdk(engines.client())

            def client(topic: str) -> list[Turn]:  # an agent resending its transcript
                return [ask(openai_client, fixed_conversation(topic, n), 12) for n in (1, 2)]

            with ThreadPoolExecutor(max_workers=len(topics)) as pool:
                agents = {topic: pool.submit(client, topic) for topic in topics}
                for text in chat_turns:  # the chat takes its turns among them
                    await send(pilot, text)
                    await wait_for(pilot, lambda: app.chat_screen.reply is None, "reply", 300)
                answers = {topic: future.result(timeout=300) for topic, future in agents.items()}
            return answers

    answers = asyncio.run(body())
    chat = History(tmp_path / "history.sqlite3")
    [stored_chat] = chat.chats()
    stored = [(m.role, m.content, m.state) for m in chat.messages(stored_chat.id)]
    chat.close()
    assert [state for _, _, state in stored] == [COMPLETE] * 4
    health = engines.client().health()
    figures = health.loaded[0].conversation_cache
    assert figures is not None and health.loads == 1
    assert figures.saved >= 1 and figures.evicted >= 1
    assert figures.used_bytes <= figures.budget_bytes == 2 << 20

    # Each answer equals the same request made alone, on an engine that keeps nothing.
    alone = start_server(
        engine_home, short_socket("alone"), "--conversation-cache", "0", "--parallel", "1"
    )
    try:
        alone_sdk = alone.openai()
        for topic in topics:
            for turns, turn in zip((1, 2), answers[topic], strict=True):
                again = ask(alone_sdk, fixed_conversation(topic, turns), 12)
                assert again.reply == turn.reply, (topic, turns)
        chat_so_far: list[dict[str, str]] = []
        for role, content, _ in stored:
            if role == "assistant":
                # Its second turn reads the first reply from the kept state.
                assert_as_alone(alone_sdk, chat_so_far, 24, content)
            chat_so_far.append({"role": role, "content": content})
    finally:
        alone.stop()
