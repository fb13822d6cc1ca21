"""`draftpen chat` flags override the settings file for one run, and bad ones say why."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.cli.repl import INTERRUPTED_NOTE, PlainChat
from app.client import EngineClient, EngineLost
from app.main import build_parser
from app.options import chat_settings
from app.settings import Settings, save_settings
from tests.support.engine_fixtures import wait_until
from tests.support.engine_process import pid_alive, sdk, sdk_chat, short_socket, stop_engine
from tests.support.model_files import SMOLLM2_KEY, require_model


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DRAFTPEN_HOME for this module's engines (forward costs measured once)."""
    return tmp_path_factory.mktemp("chat-engine-home")


@pytest.fixture
def engine_home(shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared home, for this test and the engines it starts."""
    monkeypatch.setenv("DRAFTPEN_HOME", str(shared_home))
    return shared_home


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
    engine_home: Path, monkeypatch: pytest.MonkeyPatch
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


class Screen:
    """Stands in for the terminal's stdout: keeps what the chat printed, thread-safely."""

    def __init__(self) -> None:
        self.text = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@pytest.mark.real_model
def test_plain_chat_keeps_the_reply_when_the_engine_dies_and_goes_on_with_a_new_one(
    engine_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    require_model(SMOLLM2_KEY)
    socket_path = short_socket("plain-killed")
    monkeypatch.setenv("DRAFTPEN_SOCKET", str(socket_path))
    args = build_parser().parse_args(
        ["chat", "--plain", "--pair", "smollm2", "--temperature", "0", "--max-tokens", "400"]
    )
    reading, writing = os.pipe()
    monkeypatch.setattr("sys.stdin", os.fdopen(reading, "r"))
    screen = Screen()
    monkeypatch.setattr("sys.stdout", screen)
    client = EngineClient(socket_path)
    killed: list[int] = []
    failures: list[BaseException] = []

    def person() -> None:
        """Types a message, kills the engine once the reply is under way, types another."""
        with os.fdopen(writing, "w") as keyboard:
            try:
                keyboard.write("Count from 1 to 300, separated by commas, nothing else.\n")
                keyboard.flush()
                wait_until(lambda: len(screen.text) > 60, "the reply to be under way", 300)
                pid = client.health().pid
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

                def new_engine_holds_the_pair() -> bool:
                    try:
                        health = client.health()
                    except EngineLost:
                        return False
                    return health.pid != pid and [p.pair for p in health.loaded] == ["smollm2"]

                wait_until(new_engine_holds_the_pair, "a new engine with the pair", 300)
                keyboard.write("Name three colours.\n/exit\n")
            except BaseException as error:  # reported by the test, not lost in the thread
                failures.append(error)

    typist = threading.Thread(target=person)
    typist.start()
    chat = PlainChat(args, chat_settings(args))
    try:
        assert chat.run() == 0
        typist.join(60)
        assert not failures, failures
        new_pid = client.health().pid
    finally:
        stop_engine(client)
    err = capsys.readouterr().err
    [old_pid] = killed
    assert new_pid != old_pid and not pid_alive(old_pid)
    assert INTERRUPTED_NOTE in err and "What it wrote is kept in the chat." in err
    assert "starting the engine again" in err
    # The chat went on with the interrupted reply in it, and the next one finished.
    roles = [message.role for message in chat.messages]
    assert roles == ["user", "assistant", "user", "assistant"]
    interrupted, answered = chat.messages[1].content, chat.messages[3].content
    assert interrupted and interrupted in screen.text and answered in screen.text
    assert re.search(r"\[\d+ tokens, [0-9.]+ tok/s", err.split(INTERRUPTED_NOTE)[1])
