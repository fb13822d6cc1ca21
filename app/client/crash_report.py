"""How a client learns that the engine's runtime crashed, and when to stop restarting it.

The model runtime (llama.cpp, MLX) runs inside the engine process, so when it crashes
(a segmentation fault in a CPU kernel, an instruction this CPU lacks) the engine dies
with it and can tell nobody anything over its socket. So the engine keeps a record
beside its socket (``app.engine.crash_record`` writes it):

- ``<socket>.activity``: a small JSON file, kept current, saying which process the
  engine is and what it is doing (loading pair X, generating with pair X, idle), and
  ``stopped`` once it stopped cleanly;
- ``<socket>.fatal``: where Python's ``faulthandler`` writes "Fatal Python error:
  Segmentation fault" and every thread's stack as the process dies by a signal.

A client whose connection dropped reads both (:func:`crash_error`) and raises
:class:`~app.client.errors.EngineCrashedError`, naming the signal, the pair and the fix.
Where this process started the engine itself, the exit status says the signal too.

One retry, not a loop: :func:`crash_error` remembers each crashed engine once, and
``ensure_engine`` refuses to start another after :data:`MAX_CRASHES` crashes within
:data:`CRASH_WINDOW_SECONDS` (:func:`refuse_after_crashes`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from app.client.errors import EngineCrashedError, EngineCrashLoopError

# What the engine records it is doing; "stopped" means it stopped cleanly.
LOADING, GENERATING, IDLE, STOPPED = "loading", "generating", "idle", "stopped"
# The second crash is the last: one restart after the first, none after the second.
MAX_CRASHES = 2
# Crashes further apart than this are not a loop: a front end may start the engine again.
CRASH_WINDOW_SECONDS = 600.0
# How long a client waits for an engine it started to be reaped, to read its exit status.
_EXIT_WAIT_SECONDS = 2.0

# faulthandler's words for the signals it catches (CPython's faulthandler.c).
_FAULT_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Illegal instruction": "SIGILL",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Aborted": "SIGABRT",
}
_FATAL_LINE = re.compile(r"^Fatal Python error: (?P<what>[A-Za-z -]+?)\s*$", re.MULTILINE)
_HEADER = re.compile(r"^draftpen engine pid (?P<pid>\d+)", re.MULTILINE)
# Written by the engine (app.engine.crash_record.note_runtime_abort) as llama.cpp aborts,
# for each worker that no longer listens: "lost worker 10.0.0.2:50052: connection refused".
LOST_WORKER = re.compile(r"^lost worker (?P<worker>\S+): (?P<why>.*)$", re.MULTILINE)
# The signals a crash of native code ends in (a kill by a person or the OOM killer
# is not a runtime crash, and is reported as a lost engine).
FATAL_SIGNALS = frozenset(_FAULT_SIGNALS.values())
# What each signal most likely means here, in a few words.
_MEANING = {
    "SIGSEGV": "a segmentation fault",
    "SIGILL": "an instruction this CPU does not have: a runtime built for another CPU",
    "SIGBUS": "a bus error",
    "SIGFPE": "an arithmetic fault",
    "SIGABRT": "the runtime aborted on a failed check",
}
_RUNTIME_NAMES = {"llamacpp": "llama.cpp", "mlx": "MLX"}


def activity_path(socket_path: Path) -> Path:
    """``<socket>.activity``: what the engine on ``socket_path`` is doing."""
    return socket_path.with_name(f"{socket_path.name}.activity")


def fatal_path(socket_path: Path) -> Path:
    """``<socket>.fatal``: where the engine's ``faulthandler`` writes a fatal signal."""
    return socket_path.with_name(f"{socket_path.name}.fatal")


@dataclass(frozen=True)
class EngineActivity:
    """What an engine process last recorded it was doing."""

    pid: int
    doing: str
    pair: str | None = None
    runtime: str | None = None
    since: float = 0.0  # seconds since the epoch

    def as_json(self) -> str:
        """The record as the engine writes it."""
        return json.dumps(
            {
                "pid": self.pid,
                "doing": self.doing,
                "pair": self.pair,
                "runtime": self.runtime,
                "since": self.since,
            }
        )


@dataclass(frozen=True)
class EngineCrash:
    """An engine that died by a fatal signal, and what it was doing then."""

    signal_name: str
    pid: int | None = None
    doing: str | None = None
    pair: str | None = None
    runtime: str | None = None
    record: Path | None = None  # the fatal record, when the engine wrote one
    # Workers (HOST:PORT) found gone as the runtime aborted: the crash was theirs.
    lost_workers: tuple[str, ...] = ()
    # Why each was found gone, in the same order ("connection refused", "did not answer
    # for 31 s ..."); may be empty.
    lost_reasons: tuple[str, ...] = ()

    def message(self, *, gives_up: bool = False, ended: str = "the engine") -> str:
        """What a person is told: the signal, the pair, the fix. ``ended``: what the
        runtime's abort took down with it (the engine, or only its runtime process)."""
        runtime = _RUNTIME_NAMES.get(self.runtime or "", "model")
        meaning = _MEANING.get(self.signal_name, "a fatal signal")
        text = f"The {runtime} runtime crashed ({self.signal_name}, {meaning}) {self.when()}."
        if self.lost_workers:
            text = (
                f"Worker {', '.join(self.lost_workers)} stopped answering {self.when()}"
                f"{self._reasons()}, and "
                f"llama.cpp ended {ended} with it (the target's layers there are gone). "
                "Start `draftpen worker` there again and ask again, or load the pair without "
                "it (serve without it in --workers or the workers setting)."
            )
            if self.record is not None:
                text += f" (The crash record: {self.record}.)"
            return text
        if gives_up:
            text += (
                " The engine has now crashed twice, so draftpen does not start it again."
                " Run `draftpen doctor` to check the runtime build; once it passes, start"
                " draftpen again."
            )
        else:
            text += " Run `draftpen doctor` to check the runtime build."
        if self.record is not None:
            text += f" (The crash record: {self.record}.)"
        return text

    def _reasons(self) -> str:
        """`` (connection refused)``; each worker named where there are several."""
        reasons = [why.strip() for why in self.lost_reasons if why.strip()]
        if not reasons:
            return ""
        if len(reasons) == 1 and len(self.lost_workers) == 1:
            return f" ({reasons[0]})"
        pairs = zip(self.lost_workers, self.lost_reasons, strict=False)
        return " (" + "; ".join(f"{worker}: {why}" for worker, why in pairs) + ")"

    def when(self) -> str:
        """``while generating with pair 'starter'``, and the like."""
        if self.doing == LOADING and self.pair:
            return f"while loading pair '{self.pair}'"
        if self.doing == GENERATING and self.pair:
            return f"while generating with pair '{self.pair}'"
        if self.pair:
            return f"while the engine held pair '{self.pair}'"
        return "in the draftpen engine"


def read_activity(socket_path: Path) -> EngineActivity | None:
    """The engine's activity record beside ``socket_path``; None if absent or unreadable."""
    try:
        data = json.loads(activity_path(socket_path).read_text())
        return EngineActivity(
            pid=int(data["pid"]),
            doing=str(data["doing"]),
            pair=data.get("pair"),
            runtime=data.get("runtime"),
            since=float(data.get("since", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fatal_signal(text: str) -> str | None:
    """The signal faulthandler reported in ``text`` ("SIGSEGV"), if it reported one."""
    match = _FATAL_LINE.search(text)
    return _FAULT_SIGNALS.get(match["what"]) if match else None


def read_crash(
    socket_path: Path,
    *,
    pid: int | None = None,
    process: subprocess.Popen[bytes] | None = None,
) -> EngineCrash | None:
    """The crash of the engine on ``socket_path``, if it died by a fatal signal.

    ``pid``: the engine the caller talked to, when it knows (records of another engine
    are then not its). ``process``: the engine, when the caller started it; its exit
    status names the signal when the engine could not write a record (a crash before it
    set up its record). None when the engine stopped cleanly, is still running as far as
    anyone can tell, or was killed by something other than a crash.
    """
    activity = read_activity(socket_path)
    if activity is not None and pid is not None and activity.pid != pid:
        activity = None  # a newer engine's record: it says nothing of ours
    if activity is not None and activity.doing == STOPPED:
        return None
    signal_name: str | None = None
    record: Path | None = None
    lost: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    if activity is not None:
        try:
            text = fatal_path(socket_path).read_text(errors="replace")
        except OSError:
            text = ""
        header = _HEADER.search(text)
        if header is not None and int(header["pid"]) == activity.pid:
            signal_name = fatal_signal(text)
            record = fatal_path(socket_path) if signal_name else None
            matches = list(LOST_WORKER.finditer(text))
            lost = tuple(match["worker"] for match in matches)
            reasons = tuple(match["why"] for match in matches)
    # Our own child's exit status, unless the records speak of another engine.
    if signal_name is None and process is not None and _same_engine(process, pid, activity):
        signal_name = _exit_signal(process)
    if signal_name is None:
        return None
    return EngineCrash(
        signal_name=signal_name,
        pid=activity.pid if activity is not None else (process.pid if process else pid),
        doing=activity.doing if activity is not None else None,
        pair=activity.pair if activity is not None else None,
        runtime=activity.runtime if activity is not None else None,
        record=record,
        lost_workers=lost if record is not None else (),
        lost_reasons=reasons if record is not None else (),
    )


def _same_engine(
    process: subprocess.Popen[bytes], pid: int | None, activity: EngineActivity | None
) -> bool:
    """Whether ``process`` is the engine the caller talked to and the record names."""
    return (pid is None or process.pid == pid) and (activity is None or activity.pid == process.pid)


def _exit_signal(process: subprocess.Popen[bytes]) -> str | None:
    """The fatal signal ``process`` died by, once it has exited (waiting a moment)."""
    try:
        code = process.wait(_EXIT_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        return None  # still running: whatever dropped the connection, it was no crash
    if code >= 0:
        return None
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return None
    return name if name in FATAL_SIGNALS else None


# -- what this process has seen: one restart, then no more ---------------------------

_lock = threading.Lock()
# Per socket: each crashed engine's pid (or a counter where unknown) -> when it was seen.
_seen: dict[str, dict[object, tuple[float, EngineCrash]]] = {}
# Per socket: the engine this process started last, for its exit status.
_started: dict[str, subprocess.Popen[bytes]] = {}


def remember_started(socket_path: Path, process: subprocess.Popen[bytes]) -> None:
    """``ensure_engine`` started ``process`` as the engine on ``socket_path``."""
    with _lock:
        _started[os.fspath(socket_path)] = process


def started_process(socket_path: Path) -> subprocess.Popen[bytes] | None:
    """The engine this process started last on ``socket_path``, if any."""
    with _lock:
        return _started.get(os.fspath(socket_path))


def remember_crash(socket_path: Path, crash: EngineCrash) -> int:
    """Count ``crash`` (each engine once); returns the crashes within the window."""
    now = time.monotonic()
    with _lock:
        seen = _seen.setdefault(os.fspath(socket_path), {})
        key: object = crash.pid if crash.pid is not None else object()
        seen.setdefault(key, (now, crash))
        return len(_recent(seen, now))


def recent_crashes(socket_path: Path) -> list[EngineCrash]:
    """The crashes this process saw on ``socket_path`` within the window, oldest first."""
    with _lock:
        return _recent(_seen.get(os.fspath(socket_path), {}), time.monotonic())


def forget_crashes() -> None:
    """Forget every crash seen (a fresh front-end session; tests)."""
    with _lock:
        _seen.clear()
        _started.clear()


def _recent(seen: dict[object, tuple[float, EngineCrash]], now: float) -> list[EngineCrash]:
    times = sorted(seen.values(), key=lambda entry: entry[0])
    return [crash for when, crash in times if now - when <= CRASH_WINDOW_SECONDS]


def crash_error(socket_path: Path, *, pid: int | None = None) -> EngineCrashedError | None:
    """The error to raise for an engine that was lost, when it crashed; else None.

    Called where a client lost the engine (a dropped stream, a refused connection). The
    crash is remembered for :func:`refuse_after_crashes`; the second one's message says
    that draftpen will not start the engine again.
    """
    crash = read_crash(socket_path, pid=pid, process=started_process(socket_path))
    if crash is None:
        return None
    gives_up = remember_crash(socket_path, crash) >= MAX_CRASHES
    return EngineCrashedError(
        crash.message(gives_up=gives_up),
        signal_name=crash.signal_name,
        doing=crash.doing,
        pair=crash.pair,
        gives_up=gives_up,
    )


def refuse_after_crashes(socket_path: Path) -> None:
    """Raise :class:`EngineCrashLoopError` when the engine crashed too often to restart."""
    crashes = recent_crashes(socket_path)
    if len(crashes) >= MAX_CRASHES:
        raise EngineCrashLoopError(crashes[-1].message(gives_up=True))
