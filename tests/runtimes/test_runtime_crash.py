"""A runtime that crashes inside the engine: the engine and ``generate`` say so, and none
loops.

The engines here are real ``draftpen serve`` processes with SmolLM2 whose runtime
crashes where the test hook says; the crash record names the signal, the pair and
``draftpen doctor``, and each crashed engine counts once toward the one restart.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import openai
import pytest

from app.client import (
    ChatTurn,
    EngineClient,
    EngineCrashedError,
    EngineCrashLoopError,
    EngineLost,
    crash_report,
    engine_log_path,
    ensure_engine,
)
from app.client.crash_report import (
    EngineCrash,
    activity_path,
    fatal_path,
    fatal_signal,
    read_crash,
)
from app.engine.crash_record import CrashRecorder, crash_test_hook
from app.errors import DraftpenError
from app.settings import Settings
from backends.base import ChatMessage
from backends.generation_events import GenerationEvent
from backends.sampling.filters import SamplingParams
from tests.runtimes.crashing_engine import (
    CRASH_ON_DECODE,
    LONG_REPLY,
    PAIR,
    fresh_front_end,  # noqa: F401  (a fixture)
)
from tests.support.draftpen_cli import run_draftpen
from tests.support.engine_fixtures import wait_until
from tests.support.engine_process import pid_alive, sdk
from tests.support.real_engine_app import COUNT_PROMPT


def long_turn() -> ChatTurn:
    return ChatTurn(
        PAIR,
        (ChatMessage("user", COUNT_PROMPT),),
        SamplingParams(temperature=0.0),
        max_tokens=LONG_REPLY,
        drafter="none",
    )


def start_engine(socket_path: Path) -> EngineClient:
    return ensure_engine(Settings(), socket_path=socket_path, serve_options=["--keep-alive", "-1"])


# -- through the real client: the signal, the pair, the fix ---------------------------


@pytest.mark.real_model
def test_a_runtime_crash_mid_reply_names_the_signal_the_pair_and_doctor_and_keeps_the_text(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", CRASH_ON_DECODE)
    client = start_engine(socket_path)
    pid = client.health().pid
    received: list[str] = []
    with pytest.raises(EngineCrashedError) as caught:
        for item in client.chat(long_turn()):
            if isinstance(item, GenerationEvent):
                received.append(item.text)
    crash = caught.value
    assert isinstance(crash, EngineLost)  # every front end's EngineLost path keeps the text
    assert (crash.signal_name, crash.doing, crash.pair) == ("SIGSEGV", "generating", PAIR)
    message = str(crash)
    assert "llama.cpp runtime crashed (SIGSEGV" in message
    assert f"while generating with pair '{PAIR}'" in message
    assert "Run `draftpen doctor`" in message and not crash.gives_up
    assert "".join(received).strip(), "the reply had begun before the crash"
    engine_process = crash_report.started_process(socket_path)
    assert engine_process is not None and engine_process.pid == pid
    assert engine_process.wait(60) == -signal.SIGSEGV  # it died by the signal, for real
    # The engine's own record: faulthandler's words, under this engine's pid.
    record = fatal_path(socket_path).read_text()
    assert f"draftpen engine pid {pid}" in record
    assert "Fatal Python error: Segmentation fault" in record


@pytest.mark.real_model
def test_a_runtime_crash_while_loading_names_the_pair_and_the_likely_cause(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "load:SIGILL")
    client = start_engine(socket_path)
    with pytest.raises(EngineCrashedError) as caught:
        client.load(PAIR)
    crash = caught.value
    assert (crash.signal_name, crash.doing, crash.pair) == ("SIGILL", "loading", PAIR)
    assert f"while loading pair '{PAIR}'" in str(crash)
    assert "built for another CPU" in str(crash) and "draftpen doctor" in str(crash)


@pytest.mark.real_model
def test_a_crashing_engine_is_started_once_more_then_not_at_all(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, engine_starts: list[int]
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", CRASH_ON_DECODE)
    first = start_engine(socket_path)
    assert first.health().previous_crash is None  # a new socket: no engine before it

    # An OpenAI SDK client sees only its stream cut: the engine that could say more
    # is the process that died (the runtime runs inside it).
    with pytest.raises((openai.APIConnectionError, httpx.TransportError)):
        stream = sdk(first).chat.completions.create(
            model=PAIR,
            messages=[{"role": "user", "content": COUNT_PROMPT}],
            temperature=0,
            max_tokens=LONG_REPLY,
            stream=True,
        )
        for _ in stream:
            pass
    # draftpen's client, asking next, learns why from the record the engine left.
    with pytest.raises(EngineCrashedError) as caught:
        first.health()
    assert caught.value.signal_name == "SIGSEGV" and not caught.value.gives_up

    # One restart; the new engine's log says what became of the one before.
    logged_before = engine_log_path().stat().st_size
    second = start_engine(socket_path)
    assert len(engine_starts) == 2
    with engine_log_path().open("rb") as log:
        log.seek(logged_before)
        new_lines = log.read().decode(errors="replace")
    assert "the previous engine on this socket died: The llama.cpp runtime crashed" in new_lines
    assert "Fatal Python error: Segmentation fault" in new_lines  # its record, for bug reports
    # An API client whose stream was cut asks the new engine's /health why.
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path))) as http:
        health = http.get("http://draftpen/health").json()
    previous = health["previous_crash"]
    assert (previous["signal"], previous["doing"], previous["pair"]) == (
        "SIGSEGV",
        "generating",
        PAIR,
    )
    assert "draftpen doctor" in previous["message"]
    assert second.health().previous_crash is not None
    with pytest.raises(EngineCrashedError) as caught:
        list(second.chat(long_turn()))
    assert caught.value.gives_up and "crashed twice" in str(caught.value)

    # No third engine, now or when asked again; the refusal says why and what to run.
    for _ in range(2):
        with pytest.raises(EngineCrashLoopError) as refused:
            start_engine(socket_path)
        assert "crashed twice" in str(refused.value) and "draftpen doctor" in str(refused.value)
    assert len(engine_starts) == 2
    for pid in engine_starts:
        wait_until(lambda pid=pid: not pid_alive(pid), f"engine {pid} to be gone", 60)


# -- the front ends ---------------------------------------------------------------


@pytest.mark.real_model
def test_generate_with_engine_exits_non_zero_naming_the_crash_after_the_partial_answer(
    socket_path: Path,
) -> None:
    result = run_draftpen(
        "generate",
        "--engine",
        "--pair",
        PAIR,
        "--temperature",
        "0",
        "--drafter",
        "none",
        "--max-tokens",
        str(LONG_REPLY),
        "--prompt",
        COUNT_PROMPT,
        env={"DRAFTPEN_SOCKET": str(socket_path), "DRAFTPEN_TEST_CRASH": CRASH_ON_DECODE},
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("draftpen: The llama.cpp runtime crashed (SIGSEGV"), last
    assert f"pair '{PAIR}'" in last and "draftpen doctor" in last
    assert result.stdout.strip() and result.stdout.endswith("\n")  # the answer so far


# -- the record itself, without an engine -----------------------------------------


def test_faulthandlers_words_name_the_signal() -> None:
    assert fatal_signal("Fatal Python error: Segmentation fault\n\nThread 0x1") == "SIGSEGV"
    assert fatal_signal("x\nFatal Python error: Illegal instruction\n") == "SIGILL"
    assert fatal_signal("Fatal Python error: Aborted\n") == "SIGABRT"
    assert fatal_signal("Fatal Python error: Bus error\n") == "SIGBUS"
    assert fatal_signal("Fatal Python error: Floating-point exception\n") == "SIGFPE"
    assert fatal_signal("draftpen engine pid 12 started\n") is None


def test_a_record_of_a_clean_stop_or_of_another_engine_is_no_crash(tmp_path: Path) -> None:
    socket_path = tmp_path / "engine.sock"
    recorder = CrashRecorder(socket_path, "llamacpp")
    recorder.note("generating", PAIR)
    pid = os.getpid()
    fatal_path(socket_path).write_text(
        f"draftpen engine pid {pid} started\nFatal Python error: Segmentation fault\n"
    )
    crash = read_crash(socket_path)
    assert crash is not None and (crash.pid, crash.signal_name, crash.pair) == (
        pid,
        "SIGSEGV",
        PAIR,
    )
    assert read_crash(socket_path, pid=pid + 1) is None  # a client of another engine
    # A record whose fatal file belongs to another process says nothing.
    fatal_path(socket_path).write_text(
        "draftpen engine pid 1 started\nFatal Python error: Aborted\n"
    )
    assert read_crash(socket_path) is None
    recorder.note("stopped")
    assert json.loads(activity_path(socket_path).read_text())["doing"] == "stopped"
    assert read_crash(socket_path) is None


def test_each_crashed_engine_counts_once_toward_the_one_restart(tmp_path: Path) -> None:
    socket_path = tmp_path / "engine.sock"
    crash = EngineCrash("SIGSEGV", pid=10, doing="generating", pair=PAIR)
    assert crash_report.remember_crash(socket_path, crash) == 1
    assert crash_report.remember_crash(socket_path, crash) == 1  # seen by a second client
    crash_report.refuse_after_crashes(socket_path)  # one crash: a restart is fine
    again = EngineCrash("SIGSEGV", pid=11, doing="generating", pair=PAIR)
    assert crash_report.remember_crash(socket_path, again) == 2
    with pytest.raises(EngineCrashLoopError, match="crashed twice"):
        crash_report.refuse_after_crashes(socket_path)
    crash_report.refuse_after_crashes(tmp_path / "other.sock")  # another engine's socket


def test_the_test_hook_reads_its_point_signal_and_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "decode:SIGSEGV:3")
    hook = crash_test_hook()
    assert hook is not None and (hook.point, hook.signal_name, hook.forward) == (
        "decode",
        "SIGSEGV",
        3,
    )
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "decode:SIGNOPE")
    with pytest.raises(DraftpenError, match="DRAFTPEN_TEST_CRASH wants"):
        crash_test_hook()
    monkeypatch.delenv("DRAFTPEN_TEST_CRASH")
    assert crash_test_hook() is None
