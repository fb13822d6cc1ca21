"""``draftpen chat --target T --draft D``: the chat's engine, a separate process that never
saw that command line, learns the pair from the files the chat sends with its load.

A real engine process on its real socket: started by the plain chat itself (in a fresh
home), then reached by the official SDK naming the pair, and its runtime process killed
to show a restarted runtime still knows the pair. Loads that name files the engine's
machine lacks, or a name its catalog has, are refused with a message that names the fix.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.client import EngineClient, EngineRequestError, ensure_engine
from app.errors import PairInputError
from app.models.catalog_file import forget_command_line_pairs
from app.models.command_line_pairs import command_line_pair_files, share_command_line_pair
from app.settings import Settings
from tests.support.engine_fixtures import wait_until
from tests.support.engine_process import short_socket, stop_engine
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target

PAIR = "tiny-llama"  # the name use_command_line_pair gives tiny-llama.gguf


def greedy_answer(client: EngineClient, text: str) -> str:
    """One greedy reply from the official SDK naming the --target pair."""
    import httpx
    import openai

    transport = httpx.HTTPTransport(uds=str(client.socket_path))
    sdk = openai.OpenAI(
        api_key="unused",
        base_url="http://draftpen/v1",
        http_client=httpx.Client(transport=transport, timeout=600),
        max_retries=0,
    )
    answer = sdk.chat.completions.create(
        model=PAIR,
        messages=[{"role": "user", "content": text}],
        temperature=0,
        max_tokens=12,
        extra_body={"speculative": {"drafter": "ngram", "k": 3}},
    )
    return answer.choices[0].message.content or ""


@pytest.mark.real_model
def test_plain_chat_with_target_and_draft_answers_through_an_engine_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    target = write_tiny_target(tmp_path / "tiny-llama.gguf", require_model(SMOLLM2_KEY), seed=1)
    head = write_eagle3_head(tmp_path / "tiny-llama-eagle3.gguf", target, seed=2)
    socket_path = short_socket("target-chat")
    monkeypatch.setenv("DRAFTPEN_HOME", str(home))
    monkeypatch.setenv("DRAFTPEN_SOCKET", str(socket_path))
    result = subprocess.run(
        [
            sys.executable, "-m", "app.main", "chat", "--plain",
            "--target", str(target), "--draft", str(head),
            "--temperature", "0", "--max-tokens", "12",
        ],
        input="Name three colours.\n/exit\n",
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    client = EngineClient(socket_path)
    try:
        assert result.returncode == 0, result.stderr[-2000:]
        assert "Starting the draftpen engine" in result.stderr
        assert "is not a draftpen pair" not in result.stderr
        assert re.search(r"\[\d+ tokens, [0-9.]+ tok/s", result.stderr), result.stderr[-2000:]
        # The engine's front has the pair: listed, and found by a client naming it.
        assert PAIR in {card.id for card in client.pairs()}
        before = greedy_answer(client, "Name three colours.")
        assert before
        # A runtime started again after a crash still knows the pair: it preloads it.
        health = client.health()
        assert health.runtime is not None and health.runtime.pid is not None
        os.kill(health.runtime.pid, signal.SIGKILL)

        def reloaded() -> bool:
            now = client.health()
            restarted = now.runtime is not None and now.runtime.restarts == 1
            return restarted and [pair.pair for pair in now.loaded] == [PAIR]

        wait_until(reloaded, "the restarted runtime to hold the pair", seconds=120)
        assert greedy_answer(client, "Name three colours.") == before
    finally:
        stop_engine(client)


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineClient]:
    """A fresh engine, started as a front end starts it; nothing loaded."""
    monkeypatch.setenv("DRAFTPEN_HOME", str(tmp_path / "home"))
    client = ensure_engine(Settings(), socket_path=short_socket("target-refused"))
    yield client
    stop_engine(client)


def test_a_load_naming_files_the_engine_lacks_is_refused_with_the_fix(
    engine: EngineClient, tmp_path: Path
) -> None:
    missing = tmp_path / "elsewhere" / "model.gguf"
    with pytest.raises(EngineRequestError) as refused:
        engine.load("model", files=(missing, None))
    message = str(refused.value)
    assert f"finds no file at {missing}" in message
    assert "on the machine the engine runs on" in message
    assert "model" not in {card.id for card in engine.pairs()}


def test_a_load_may_not_hide_a_catalog_pair_under_a_target_file(
    engine: EngineClient, tmp_path: Path
) -> None:
    # An existing file is enough: the name is refused before the file is read.
    file = tmp_path / "smollm2.gguf"
    file.write_bytes(b"GGUF")
    with pytest.raises(EngineRequestError) as refused:
        engine.load("smollm2", files=(file, None))
    assert "catalog has a pair called 'smollm2'" in str(refused.value)


@pytest.mark.real_model
def test_the_same_files_again_are_the_same_pair_and_other_files_are_refused_its_name(
    tmp_path: Path,
) -> None:
    tokenizer = require_model(SMOLLM2_KEY)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_tiny_target(tmp_path / "a" / "tiny-llama.gguf", tokenizer, seed=1)
    other = write_tiny_target(tmp_path / "b" / "tiny-llama.gguf", tokenizer, seed=3)
    try:
        shared = share_command_line_pair(PAIR, str(first), None)
        # A chat app loading again (a pair switch back, a new engine) sends the files again.
        assert share_command_line_pair(PAIR, str(first), None) is shared
        assert command_line_pair_files(PAIR) == (first, None)
        with pytest.raises(PairInputError, match=f"another --target pair called '{PAIR}'"):
            share_command_line_pair(PAIR, str(other), None)
    finally:
        forget_command_line_pairs()
