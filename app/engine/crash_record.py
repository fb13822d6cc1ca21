"""The engine's record of what it is doing, and of the signal it died by, for its clients.

The model runtime runs inside the engine process; when it crashes (llama.cpp's AMX
matmul on some Intel CPUs: SIGSEGV; a wheel built for another CPU: SIGILL) the process
dies and its clients only see their connections drop. So ``draftpen serve`` keeps two
files beside its socket, which ``app.client.crash_report`` reads and explains:

- ``<socket>.activity``: which process this is and what it is doing (loading pair X,
  generating with pair X, idle), rewritten atomically whenever that changes (twice a
  request: nothing next to a generation's cost), and ``stopped`` on a clean stop;
- ``<socket>.fatal``: Python's ``faulthandler`` writes the fatal signal and every
  thread's stack there as the process dies (from its signal handler, which needs no
  working Python), under a header line naming the process.

Only the engine that owns the socket writes them (``serve`` checks that first), and an
engine that starts logs the crash its predecessor left before it starts its own record.

Test hook (tests only, never set by draftpen): ``DRAFTPEN_TEST_CRASH=POINT:SIGNAL[:N]``
in the engine's environment makes the engine kill itself with SIGNAL at POINT, the way a
crashing runtime would: ``load`` as it starts loading a pair, ``decode`` on the N-th
forward pass of a loaded pair's target (default :data:`DEFAULT_CRASH_FORWARD`), so a
reply has begun. For example ``DRAFTPEN_TEST_CRASH=decode:SIGSEGV``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from app.client.crash_report import (
    GENERATING,
    IDLE,
    LOADING,
    STOPPED,
    EngineActivity,
    EngineCrash,
    activity_path,
    fatal_path,
    read_crash,
)
from app.client.wire import PreviousCrashReport
from app.errors import DraftpenError
from backends.engine import Engine

logger = logging.getLogger("draftpen.server")

CRASH_TEST_ENV = "DRAFTPEN_TEST_CRASH"
# Enough forward passes for a reply to have reached the client before the crash.
DEFAULT_CRASH_FORWARD = 6
# How much of a predecessor's fatal record goes into the log (stacks of every thread).
_LOGGED_RECORD_CHARS = 6000


class CrashRecorder:
    """Keeps ``<socket>.activity`` current and ``faulthandler`` writing ``<socket>.fatal``."""

    def __init__(self, socket_path: Path, runtime: str | None) -> None:
        self.socket_path = socket_path
        self.runtime = runtime
        self._lock = threading.Lock()
        self._fatal: TextIO | None = None
        # How the engine before this one on the socket died, if it crashed (GET /health).
        self.previous: EngineCrash | None = None

    def start(self) -> None:
        """Log a predecessor's crash, then start this engine's record."""
        previous = read_crash(self.socket_path)
        self.previous = previous
        if previous is not None:
            logger.warning("the previous engine on this socket died: %s", previous.message())
            if previous.record is not None:
                with contextlib.suppress(OSError):
                    text = previous.record.read_text(errors="replace")
                    logger.warning("its crash record:\n%s", text[:_LOGGED_RECORD_CHARS])
        path = fatal_path(self.socket_path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # never follow a link someone left in a shared socket directory
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        self._fatal = os.fdopen(descriptor, "w")
        self._fatal.write(f"draftpen engine pid {os.getpid()} started {time.ctime()}\n")
        self._fatal.flush()
        # The file stays open for faulthandler, which writes to its descriptor directly.
        faulthandler.enable(self._fatal, all_threads=True)
        self.note(IDLE)

    def note(self, doing: str, pair: str | None = None) -> None:
        """Record what the engine does now (atomically: a reader never sees half of it)."""
        record = EngineActivity(os.getpid(), doing, pair, self.runtime, time.time())
        target = activity_path(self.socket_path)
        temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        with self._lock:
            try:
                with contextlib.suppress(FileNotFoundError):
                    temporary.unlink()
                descriptor = os.open(
                    temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
                )
                with os.fdopen(descriptor, "w") as file:
                    file.write(record.as_json())
                os.replace(temporary, target)
            except OSError as error:  # a full disk must not stop the engine serving
                logger.warning("could not record the engine's activity: %s", error)

    @contextlib.contextmanager
    def activity(self, doing: str, pair: str) -> Iterator[None]:
        """Record ``doing`` with ``pair`` for the duration of the block, then idle."""
        self.note(doing, pair)
        held: str | None = None
        try:
            yield
            held = pair
        finally:
            self.note(IDLE, held)

    def note_abort(self, lines: list[str]) -> None:
        """Add ``lines`` to the fatal record (the runtime is about to abort)."""
        if self._fatal is not None:
            with contextlib.suppress(OSError, ValueError):
                self._fatal.write("".join(f"{line}\n" for line in lines))
                self._fatal.flush()

    def stop(self) -> None:
        """A clean stop: say so, and stop writing fatal records."""
        self.note(STOPPED)
        if self._fatal is not None:
            faulthandler.disable()
            self._fatal.close()
            self._fatal = None
            with contextlib.suppress(FileNotFoundError):
                fatal_path(self.socket_path).unlink()


# The engine process's one recorder (set by ``serve``); None in embedding programs and
# tests that run an engine in their own process, where nothing is recorded.
_recorder: CrashRecorder | None = None


def start_recording(socket_path: Path, runtime: str | None) -> CrashRecorder:
    """Start this process's crash record for the engine on ``socket_path``."""
    global _recorder
    recorder = CrashRecorder(socket_path, runtime)
    recorder.start()
    _recorder = recorder
    return recorder


def stop_recording() -> None:
    """Record a clean stop (``serve`` calls it as it ends)."""
    global _recorder
    if _recorder is not None:
        _recorder.stop()
        _recorder = None


def note_runtime_abort(message: str, lost_workers: list[tuple[str, str]]) -> None:
    """Record llama.cpp's abort message and the workers gone by then (``lost worker
    HOST:PORT: why`` lines, which ``app.client.crash_report`` reads)."""
    lines = [f"runtime abort: {message}"]
    lines += [f"lost worker {worker}: {why}" for worker, why in lost_workers]
    if _recorder is not None:
        _recorder.note_abort(lines)


def previous_crash() -> PreviousCrashReport | None:
    """For ``GET /health``: the crash of the engine this one replaced on its socket."""
    crash = None if _recorder is None else _recorder.previous
    if crash is None:
        return None
    return PreviousCrashReport(
        signal=crash.signal_name, doing=crash.doing, pair=crash.pair, message=crash.message()
    )


def activity(doing: str, pair: str) -> contextlib.AbstractContextManager[None]:
    """Record what the engine does during a block (nothing where nothing is recorded)."""
    if _recorder is None:
        return contextlib.nullcontext()
    return _recorder.activity(doing, pair)


def generating(pair: str) -> contextlib.AbstractContextManager[None]:
    """The engine generates with ``pair`` during the block."""
    return activity(GENERATING, pair)


def load_watched(name: str, load: Callable[[], Engine]) -> Engine:
    """``load()`` the pair ``name``, recorded as loading (and the test hook applied)."""
    hook = crash_test_hook()
    with activity(LOADING, name):
        if hook is not None and hook.point == "load":
            hook.crash()
        engine = load()
    if hook is not None and hook.point == "decode":
        hook.crash_on_forward(engine)
    return engine


# -- the test hook -----------------------------------------------------------------


@dataclass(frozen=True)
class CrashTestHook:
    """``DRAFTPEN_TEST_CRASH``: where the engine kills itself, and with which signal."""

    point: str  # "load" or "decode"
    signal_name: str
    forward: int = DEFAULT_CRASH_FORWARD

    def crash(self) -> None:
        """Die by the signal in this thread, as a fault in the runtime would."""
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from a test
        except (ImportError, ValueError, OSError):
            pass
        signal.pthread_kill(threading.get_ident(), signal.Signals[self.signal_name])

    def crash_on_forward(self, engine: Engine) -> None:
        """Make the target's ``forward`` pass number :attr:`forward` crash.

        Patched on the target's class, so that a parallel engine's sequence views (made
        later, of a subclass) crash too: the engine process is the test's own."""
        target_class: Any = type(engine.target)
        calls = 0

        def counted(method: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                nonlocal calls
                calls += 1
                if calls >= self.forward:
                    self.crash()
                return method(*args, **kwargs)

            return call

        for name in ("forward", "forward_rows"):
            method = getattr(target_class, name, None)
            if method is not None:
                setattr(target_class, name, counted(method))


def crash_test_hook() -> CrashTestHook | None:
    """The hook ``DRAFTPEN_TEST_CRASH`` asks for, if any."""
    value = os.environ.get(CRASH_TEST_ENV, "").strip()
    if not value:
        return None
    point, _, rest = value.partition(":")
    signal_name, _, count = rest.partition(":")
    signal_name = signal_name or "SIGSEGV"
    if (
        point not in ("load", "decode")
        or signal_name not in signal.Signals.__members__
        or (count and not count.isdigit())
    ):
        raise DraftpenError(
            f"{CRASH_TEST_ENV} wants load:SIGNAL or decode:SIGNAL[:N] (a test hook), not {value!r}."
        )
    return CrashTestHook(point, signal_name, int(count) if count else DEFAULT_CRASH_FORWARD)
