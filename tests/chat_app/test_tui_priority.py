"""The chat app yields the CPU while a reply is written (app.tui.priority), on Linux."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from app.tui.priority import UI_NICENESS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice")

# Run in a child so this test process keeps its own priority.
SCRIPT = textwrap.dedent(
    """
    import os, threading
    from app.tui.priority import LowerPriority

    def nice(tid):
        return os.getpriority(os.PRIO_PROCESS, tid)

    started, finish = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), finish.wait()))
    worker.start(); started.wait()
    main, other = threading.get_native_id(), worker.native_id
    base = nice(main)
    for whole in (False, True):
        lowering = LowerPriority(whole_process=whole)
        lowering.lower(); lowering.lower()  # twice: it must not stack
        print(nice(main) - base, nice(other) - base)
        lowering.restore()
        print(nice(main) - base, nice(other) - base)
        if nice(main) != base:  # not allowed to raise it back (not root): stop here
            break
    finish.set(); worker.join()
    """
)


def test_the_ui_thread_or_the_whole_process_is_lowered_once_and_restored() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    lines = result.stdout.splitlines()
    # Only the UI (main) thread when the model runs in this process; every thread
    # when it runs in the engine's; never lowered twice.
    assert lines[0] == f"{UI_NICENESS} 0"
    if os.geteuid() == 0:  # allowed to raise it back
        assert lines == [f"{UI_NICENESS} 0", "0 0", f"{UI_NICENESS} {UI_NICENESS}", "0 0"]
    else:  # kept lowered, not lowered again
        assert lines[1] == f"{UI_NICENESS} 0"
