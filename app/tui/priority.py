"""Lowering the chat app's CPU priority while a reply is written.

On a machine with few cores, every millisecond the UI spends drawing is taken from
decoding (llama.cpp keeps all cores busy). A lower priority lets the scheduler give
the cores to the engine first; the UI still draws in the gaps. On Linux priority is
per thread, so the caller says which threads: the whole process when the engine runs
elsewhere, only the UI thread when the model runs in this process.

Lowering needs no privilege; raising it back usually does (``RLIMIT_NICE``), so
:meth:`LowerPriority.restore` tries and otherwise leaves the UI lowered: it is
idle between replies, so that costs nothing that anyone notices.
"""

from __future__ import annotations

import os
import sys
import threading

# How much lower: 5 of 19 leaves the UI about a quarter of the share of a thread at
# 0 (the engine), enough for a few redraws a second even when other programs are busy.
# Lower buys nothing measurable (benchmarks/ui_cost.py --ui-priority, 2 cores): at nice
# 19 the decode rate stayed within the noise of nice 5 while the UI's event loop woke
# 0.1-0.3 s late (median) and up to 2 s, so Esc would wait that long; SCHED_IDLE froze
# the UI for the whole reply, since llama.cpp leaves no idle CPU while it decodes (the
# machine was 0.4% idle). Nor can an unprivileged process leave SCHED_IDLE again.
UI_NICENESS = 5


def _thread_ids(whole_process: bool) -> list[int]:
    if sys.platform.startswith("linux"):
        if whole_process:
            try:
                return [int(tid) for tid in os.listdir("/proc/self/task")]
            except OSError:
                return [threading.get_native_id()]
        return [threading.main_thread().native_id or threading.get_native_id()]
    return [0]  # elsewhere priority belongs to the process


class LowerPriority:
    """Lowers threads' priority by :data:`UI_NICENESS` until :meth:`restore`."""

    def __init__(self, *, whole_process: bool) -> None:
        self.whole_process = whole_process
        # Each thread's priority before the first lowering; a failed restore must not
        # let the next lowering stack on top of the last.
        self._original: dict[int, int] = {}

    def lower(self) -> None:
        """Lower the priority (again, if threads were added since); errors are ignored."""
        if not hasattr(os, "setpriority"):
            return
        for tid in _thread_ids(self.whole_process):
            try:
                current = os.getpriority(os.PRIO_PROCESS, tid)
                original = self._original.setdefault(tid, current)
                target = min(19, original + UI_NICENESS)
                if current < target:
                    os.setpriority(os.PRIO_PROCESS, tid, target)
            except OSError:  # the thread ended, or the platform refuses: draw at full speed
                continue

    def restore(self) -> None:
        """Raise the priority back where the system allows it (see the module note)."""
        for tid, niceness in list(self._original.items()):
            try:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
            except ProcessLookupError:
                del self._original[tid]
            except OSError:
                continue
