"""The same request sent twice through a real engine (issue 55): the second reply is
mostly drafted from the history index, and it is plain decoding's reply token for token.

SmolLM2 under exact kernels (marked ``real_model``); a few seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.base import ChatMessage
from backends.caches.draft_history import HistorySettings
from backends.engine import Engine, GenerationRequest, draft_history
from backends.llamacpp.model import LlamaCppModel
from tests.support.model_files import SMOLLM2_KEY, require_model

pytestmark = pytest.mark.real_model

QUESTION = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def reply(engine: Engine, prompt: list[int], drafter: str) -> tuple[list[int], int]:
    """Greedy reply tokens and how many came from accepted drafts."""
    request = GenerationRequest(
        tuple(prompt), max_tokens=96, drafter=drafter, draft_tokens=4, exact=True
    )
    tokens: list[int] = []
    drafted = 0
    for event in engine.generate(request):
        tokens.extend(event.tokens)
        drafted += sum(event.from_draft)
    return tokens, drafted


def test_the_same_request_again_is_mostly_drafted_from_the_index(tmp_path: Path) -> None:
    target = LlamaCppModel(require_model(SMOLLM2_KEY), n_ctx=1024, exact_kernels=True)
    history = draft_history(HistorySettings(tmp_path / "history", 8 << 20), target)
    engine = Engine(target, history=history)
    try:
        prompt = engine.chat_prompt([ChatMessage("user", QUESTION)])
        plain, _ = reply(engine, prompt, "none")
        assert len(plain) > 40
        assert history.flush(30)
        again, drafted = reply(engine, prompt, "ngram")
        assert again == plain
        assert drafted >= 0.6 * len(again), f"{drafted} of {len(again)} drafted"
    finally:
        engine.close()


def test_serve_keeps_the_index_on_disk_when_it_stops(tmp_path: Path) -> None:
    # serve's runtime runs in a process of its own (issue 52): the index lives there, so
    # the front's stop must reach it and the runtime save the index before it ends.
    from backends.caches.draft_history import stored_histories
    from tests.support.serve_process import chat, start_server

    home = tmp_path / "home"
    home.mkdir()
    running = start_server(home, tmp_path / "e.sock")
    try:
        with running.client() as client:
            answer = client.post("/v1/chat/completions", json=chat(QUESTION, max_tokens=48))
        assert answer.status_code == 200, answer.text
        written = answer.json()["usage"]["completion_tokens"]
    finally:
        assert running.stop() == 0, running.log()
    [stored] = stored_histories(home / "cache" / "history")
    # The reply and the prompt's new part: at least the reply's tokens.
    assert stored.tokens >= written > 0, (stored, written)
