"""Why the engine's runtime process died, in the words every reply in flight gets, and
when the engine stops starting it again."""

from __future__ import annotations

import signal
from pathlib import Path

from app.client.crash_report import EngineActivity, activity_path, fatal_path
from app.engine.runtime_deaths import CrashWindow, death_reason

PID = 4242


def record(base: Path, doing: str, fatal: str | None) -> None:
    activity = EngineActivity(PID, doing, "starter", "llamacpp", 0.0)
    activity_path(base).write_text(activity.as_json())
    if fatal is not None:
        fatal_path(base).write_text(f"draftpen engine pid {PID} started today\n{fatal}")


def test_a_worker_lost_mid_reply_is_named_with_the_pair(tmp_path: Path) -> None:
    base = tmp_path / "engine.sock.runtime"
    record(
        base,
        "generating",
        "runtime abort: ggml-rpc.cpp:600: Remote RPC server crashed\n"
        "lost worker 127.0.0.1:50052: connection refused\n"
        "Fatal Python error: Aborted\n",
    )
    reason = death_reason(base, PID, -signal.SIGABRT)
    assert reason.startswith("Worker 127.0.0.1:50052 stopped answering while generating")
    assert "pair 'starter' (connection refused)" in reason
    assert "ended the engine's runtime process with it" in reason


def test_an_abort_names_llama_cpps_message_and_doctor(tmp_path: Path) -> None:
    base = tmp_path / "engine.sock.runtime"
    record(
        base,
        "generating",
        "runtime abort: GGML_ASSERT(n_tokens <= n_batch) failed\nFatal Python error: Aborted\n",
    )
    reason = death_reason(base, PID, -signal.SIGABRT)
    assert "The llama.cpp runtime crashed (SIGABRT" in reason
    assert "while generating with pair 'starter'" in reason and "draftpen doctor" in reason
    assert reason.endswith("llama.cpp said: GGML_ASSERT(n_tokens <= n_batch) failed")


def test_a_kill_without_a_record_says_the_signal_and_what_it_was_doing(tmp_path: Path) -> None:
    base = tmp_path / "engine.sock.runtime"
    record(base, "loading", None)
    reason = death_reason(base, PID, -signal.SIGKILL)
    assert reason.startswith(f"its process (pid {PID}) was killed by SIGKILL")
    assert reason.endswith("while loading pair 'starter'.")
    # Another process's record says nothing of this one.
    assert "starter" not in death_reason(base, PID + 1, 1)
    assert "exited with status 1" in death_reason(base, PID + 1, 1)


def test_the_window_stops_restarts_at_its_limit_and_forgets_old_deaths() -> None:
    window = CrashWindow(limit=3, window_seconds=600)
    assert window.add(0.0) and window.add(100.0)
    assert not window.add(200.0)  # the third within ten minutes
    window.clear()
    assert window.add(1000.0) and window.add(1100.0)
    assert window.add(1700.0)  # the one at 1000 s has left the window
    assert window.count() == 2
    assert window.describe() == "3 times within 10 minutes"
