"""``draftpen serve --target T --draft HEAD --parallel 2``: two clients at once on a
head pair, each reply drafted by its own sequence's EAGLE-3 head.

A real server process over the tiny random-weight llama target and the EAGLE-3 head
the tests write (tests/support/tiny_eagle3.py), with exact kernels, driven through the
official OpenAI SDK. Random weights reject most drafts; exactness does not depend on
them.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.serve_process import RunningServer, chat, start_server
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target

pytestmark = pytest.mark.real_model

TOPICS = ["Apples", "Bridges", "Cats", "Deserts"]
# Greedy, drafting with the head every round (a fixed drafter: `auto` would turn a head
# of random weights off).
HEAD_DRAFTS = {"speculative": {"drafter": "eagle3", "k": 3}}


@pytest.fixture(scope="module")
def head_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    home = tmp_path_factory.mktemp("head-parallel-home")
    (home / "config").mkdir()
    (home / "config" / "settings.toml").write_text("exact_output = true\n")
    target = write_tiny_target(home / "tiny-llama.gguf", require_model(SMOLLM2_KEY), seed=1)
    head = write_eagle3_head(home / "tiny-llama-eagle3.gguf", target, seed=2)
    running = start_server(
        home, home / "h.sock", "--target", str(target), "--draft", str(head),
        "--parallel", "2", pair=None,
    )  # fmt: skip
    yield running
    running.stop()


def reply(server: RunningServer, request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The streamed reply's text and its last ``draftpen`` statistics."""
    chunks = server.openai().chat.completions.create(**request, stream=True)
    text, stats = [], {}
    for chunk in chunks:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
        stats = (chunk.model_extra or {}).get("draftpen") or stats
    return "".join(text), stats


def test_two_clients_at_once_each_draft_with_the_head_and_get_their_replies_alone(
    head_server: RunningServer,
):
    health = head_server.health()
    assert health["queue"]["parallel"] == 2 and health["queue"]["parallel_refusal"] is None
    requests = [
        chat(
            f"{topic}: write one short sentence.",
            model="tiny-llama",  # the pair --target made
            max_tokens=24,
            extra_body=HEAD_DRAFTS,
        )
        for topic in TOPICS
    ]
    alone = [reply(head_server, request)[0] for request in requests]
    assert len(set(alone)) > 1
    with ThreadPoolExecutor(max_workers=2) as pool:
        together = list(pool.map(lambda request: reply(head_server, request), requests))
    assert [text for text, _ in together] == alone
    for _, stats in together:
        assert stats["drafted_by"]["eagle3"]["drafted"] > 0, stats
