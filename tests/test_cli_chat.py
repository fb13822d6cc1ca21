"""`draftpen chat` flags override the settings file for one run, and bad ones say why."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.client import EngineClient
from app.main import build_parser
from app.options import chat_settings
from app.settings import Settings, save_settings
from tests.model_files import SMOLLM2_KEY, require_model
from tests.test_engine_clients import sdk, sdk_chat, short_socket, stop_engine


def test_chat_flags_override_settings_for_this_run_only() -> None:
    saved = save_settings(Settings(temperature=0.9, top_k=20, drafter="model", max_tokens=300))
    args = build_parser().parse_args(["chat", "--temperature", "0", "--drafter", "ngram"])
    settings = chat_settings(args)
    assert (settings.temperature, settings.drafter) == (0.0, "ngram")
    assert (settings.top_k, settings.max_tokens) == (20, 300)  # not given: from the file
    assert "temperature = 0.9" in saved.read_text()  # the file is untouched


def test_a_bad_chat_flag_is_one_line_that_names_the_problem() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.main", "--temperature", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == "draftpen: temperature must be 0 or more (0 = always the likeliest)"
    )


@pytest.mark.real_model
def test_plain_chat_starts_an_engine_and_answers_as_an_openai_client_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_model(SMOLLM2_KEY)
    socket_path = short_socket("plain-chat")
    monkeypatch.setenv("DRAFTPEN_SOCKET", str(socket_path))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.main",
            "chat",
            "--plain",
            "--pair",
            "smollm2",
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--drafter",
            "ngram",
            "--draft-tokens",
            "4",
        ],
        input="Name three colours.\n/exit\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    client = EngineClient(socket_path)
    try:
        assert result.returncode == 0, result.stderr[-2000:]
        assert "Starting the draftpen engine" in result.stderr
        assert re.search(r"\[24 tokens, [0-9.]+ tok/s", result.stderr), result.stderr[-2000:]
        # The same request from the official SDK, on the engine the chat started.
        answer = sdk_chat(sdk(client), "Name three colours.", 24)
        assert answer and answer in result.stdout
        assert client.health().attached_clients == 0  # the chat let go when it left
    finally:
        stop_engine(client)
