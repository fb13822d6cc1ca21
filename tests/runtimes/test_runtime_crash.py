"""A runtime that crashes inside the engine's runtime process: the engine says so, starts
it again, and stops after three crashes within ten minutes.

The engines here are real ``draftpen serve`` processes with SmolLM2 whose runtime
process crashes where the test hook says; the runtime's crash record names the signal,
the pair and ``draftpen doctor``, and the engine itself stays up throughout.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import openai
import pytest

from app.client import (
    ChatTurn,
    EngineClient,
    EngineCrashLoopError,
    EngineRuntimeRestartedError,
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
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, engine_starts: list[int]
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", CRASH_ON_DECODE)
    client = start_engine(socket_path)
    health = client.health()
    assert health.runtime is not None and health.runtime.pid is not None
    engine_pid, runtime_pid = health.pid, health.runtime.pid
    received: list[str] = []
    with pytest.raises(EngineRuntimeRestartedError) as caught:
        for item in client.chat(long_turn()):
            if isinstance(item, GenerationEvent):
                received.append(item.text)
    message = str(caught.value)
    assert message.startswith("The engine's runtime restarted: The llama.cpp runtime crashed")
    assert "(SIGSEGV" in message and f"while generating with pair '{PAIR}'" in message
    assert "Run `draftpen doctor`" in message and not caught.value.stopped
    assert "".join(received).strip(), "the reply had begun before the crash"
    # The engine is the same process; its runtime is a new one, started by itself.
    wait_until(lambda: client.health().runtime.state == "running", "the new runtime", 120)  # type: ignore[union-attr]
    health = client.health()
    assert health.pid == engine_pid and health.runtime is not None
    assert health.runtime.restarts == 1 and health.runtime.pid != runtime_pid
    assert "(SIGSEGV" in (health.runtime.last_death or "")
    assert len(engine_starts) == 1
    # The runtime's own record (faulthandler's words, under the dead runtime's pid),
    # copied into the engine's log by the runtime started after it, for bug reports.
    logged = engine_log_path().read_text(errors="replace")
    assert f"draftpen engine pid {runtime_pid}" in logged
    assert "Fatal Python error: Segmentation fault" in logged


@pytest.mark.real_model
def test_a_runtime_crash_while_loading_names_the_pair_and_the_likely_cause(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "load:SIGILL")
    client = start_engine(socket_path)
    with pytest.raises(EngineRuntimeRestartedError) as caught:
        client.load(PAIR)
    message = str(caught.value)
    assert f"while loading pair '{PAIR}'" in message and "(SIGILL" in message
    assert "built for another CPU" in message and "draftpen doctor" in message


@pytest.mark.real_model
def test_a_runtime_that_crashes_three_times_is_not_started_again_and_health_says_why(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, engine_starts: list[int]
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "load:SIGSEGV")
    client = start_engine(socket_path)
    for _ in range(2):
        with pytest.raises(EngineRuntimeRestartedError) as caught:
            client.load(PAIR)
        assert not caught.value.stopped
    with pytest.raises(EngineRuntimeRestartedError) as caught:
        client.load(PAIR)
    assert caught.value.stopped and "3 times within 10 minutes" in str(caught.value)
    runtime = client.health().runtime
    assert runtime is not None and runtime.state == "stopped" and runtime.restarts == 2
    reason = runtime.stopped_reason or ""
    assert "3 times within 10 minutes" in reason and "draftpen doctor" in reason
    assert f"while loading pair '{PAIR}'" in reason and "/draftpen/load" in reason
    # A request is refused with the same words; an OpenAI client sees a 503.
    with pytest.raises(EngineRuntimeRestartedError) as refused:
        list(client.chat(long_turn()))
    assert refused.value.stopped and refused.value.status == 503
    with pytest.raises(openai.InternalServerError) as sdk_refused:
        sdk(client).chat.completions.create(
            model=PAIR, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
    assert "3 times within 10 minutes" in str(sdk_refused.value)
    # The engine stayed up all along: no front end started another.
    assert len(engine_starts) == 1 and pid_alive(client.health().pid)


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
    assert last.startswith(
        "draftpen: The engine's runtime restarted: The llama.cpp runtime crashed (SIGSEGV"
    ), last
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
