"""Why the engine's runtime process died, in words, and when to stop starting it again.

The runtime keeps its own crash record (``<socket>.runtime.activity`` and ``.fatal``,
``app.engine.crash_record``): faulthandler's fatal signal, llama.cpp's abort message and
the workers found gone. :func:`death_reason` reads it, with the process's exit status,
into the sentence every reply in flight is answered with. :class:`CrashWindow` counts
deaths: after ``limit`` within ``window_seconds`` the front stops starting the runtime
(a build that cannot run here, or a worker that is gone for good, would loop).
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections import deque
from pathlib import Path

from app.client.crash_report import GENERATING, LOADING, read_activity, read_crash
from app.engine.schema import ApiError

# Deaths within the window that stop the restarts (the N and M of "N aborts within M
# minutes"), unless serve is told otherwise.
CRASH_LIMIT = 3
CRASH_WINDOW_SECONDS = 600.0
# A client may send a reply the runtime did not finish again this soon.
RETRY_AFTER_SECONDS = "2"
_ABORT_LINE = re.compile(r"^runtime abort: (?P<message>.*)$", re.MULTILINE)


def death_reason(record_path: Path | None, pid: int, exitcode: int | None) -> str:
    """What killed runtime process ``pid`` and what it was doing, in one or two
    sentences: the crash record's words where it left one, else its exit status."""
    crash = read_crash(record_path, pid=pid) if record_path is not None else None
    if crash is not None:
        text = crash.message(ended="the engine's runtime process")
        abort = _abort_message(crash.record)
        if abort and not crash.lost_workers:
            text += f" llama.cpp said: {abort}"
        return text
    activity = read_activity(record_path) if record_path is not None else None
    if activity is not None and activity.pid != pid:
        activity = None
    doing = ""
    if activity is not None and activity.pair:
        if activity.doing == GENERATING:
            doing = f" while generating with pair '{activity.pair}'"
        elif activity.doing == LOADING:
            doing = f" while loading pair '{activity.pair}'"
        else:
            doing = f" while it held pair '{activity.pair}'"
    return f"its process (pid {pid}) {_exit_words(exitcode)}{doing}."


def _exit_words(exitcode: int | None) -> str:
    """``was killed by SIGKILL``, ``exited with status 1``."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if name == "SIGKILL":
            return "was killed by SIGKILL (by hand, or the system ran out of memory)"
        return f"was killed by {name}"
    return f"exited with status {exitcode}"


def _abort_message(record: Path | None) -> str | None:
    """The abort message llama.cpp gave (GGML_ASSERT's words), if the record has it."""
    if record is None:
        return None
    with contextlib.suppress(OSError):
        match = _ABORT_LINE.search(record.read_text(errors="replace"))
        if match is not None:
            return match["message"].strip()
    return None


class CrashWindow:
    """Deaths of the runtime within the last ``window_seconds``; full at ``limit``."""

    def __init__(
        self, limit: int = CRASH_LIMIT, window_seconds: float = CRASH_WINDOW_SECONDS
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.window_seconds = window_seconds
        self._deaths: deque[float] = deque()

    def add(self, now: float | None = None) -> bool:
        """Count a death; whether the runtime may be started again."""
        now = time.monotonic() if now is None else now
        self._deaths.append(now)
        while self._deaths and self._deaths[0] < now - self.window_seconds:
            self._deaths.popleft()
        return len(self._deaths) < self.limit

    def count(self) -> int:
        """Deaths counted in the window (as of the last :meth:`add`)."""
        return len(self._deaths)

    def clear(self) -> None:
        """Forget the deaths (a person asked for the runtime again)."""
        self._deaths.clear()

    def describe(self) -> str:
        """``3 times within 10 minutes``."""
        minutes = self.window_seconds / 60
        span = f"{minutes:g} minutes" if minutes >= 1 else f"{self.window_seconds:g} seconds"
        return f"{self.limit} times within {span}"


def restarted_error(why: str) -> ApiError:
    """The answer to a reply in flight when the runtime died (and is started again)."""
    return ApiError(
        503,
        f"The engine's runtime restarted: {why} This reply ended there (what was "
        "streamed is kept); send the request again.",
        error_type="server_error",
        code="runtime_restarted",
        headers={"Retry-After": RETRY_AFTER_SECONDS},
    )


def stopped_reason(crashes: CrashWindow, why: str) -> str:
    """Why the runtime is no longer started, and what to do."""
    return (
        f"The engine's runtime process died {crashes.describe()}, so the engine "
        f"stopped starting it again. The last time: {why} Fix the cause (`draftpen "
        "doctor` checks the runtime build; a worker named here must be running), then "
        'start it again with POST /draftpen/load {"pair": NAME} (or restart draftpen '
        "serve)."
    )


def runtime_stopped_error(reason: str) -> ApiError:
    """The answer to a request while the runtime is not started again."""
    return ApiError(503, reason, error_type="server_error", code="runtime_stopped")
