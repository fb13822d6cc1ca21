"""Finding the engine on its socket, and starting one when none runs (Ollama's habit).

A front end calls :func:`ensure_engine`: if a draftpen engine of this API version
answers on the socket it is used; if nobody does, ``draftpen serve --idle-exit`` is
started detached (its own session, output to ``engine.log`` in the cache directory,
rotated past a few MB: ``engine_log``) and waited for. Anything else on the socket, or
an engine of another API version, is an error whose message says how to clear the way.

An engine whose runtime crashes is started again once, not in a loop: after two
crashes (``crash_report``) :func:`ensure_engine` refuses with
:class:`EngineCrashLoopError`, whose message says to run ``draftpen doctor``.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from app.client.crash_report import crash_error, refuse_after_crashes, remember_started
from app.client.engine_client import EngineClient
from app.client.engine_log import engine_log_path, rotate_log
from app.client.errors import (
    EngineError,
    EngineStartError,
    EngineVersionError,
    NotAnEngineError,
)
from app.client.wire import API_VERSION, SERVICE, SOCKET_ENV, HealthReport, default_socket_path
from app.settings import Settings

# Starting an engine that loads nothing takes a second or two; a busy machine, longer.
DEFAULT_START_SECONDS = 60.0


def find_engine(socket_path: Path) -> EngineClient | None:
    """The engine answering on ``socket_path``, or None when nobody listens there.

    Raises :class:`NotAnEngineError` when something else holds the path, and
    :class:`EngineVersionError` for an engine of another API version.
    """
    try:
        info = socket_path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(info.st_mode):
        raise NotAnEngineError(
            f"{socket_path} is not a socket, so no draftpen engine can listen there. "
            f"Remove it, or set {SOCKET_ENV} to another path."
        )
    if not _someone_listens(socket_path):
        return None  # a stale socket: the engine that starts replaces it
    client = EngineClient(socket_path)
    try:
        with client._http(read_timeout=10.0) as http:
            response = http.get("/health")
        body = response.json()
        health = HealthReport.model_validate(body)
    except httpx.ConnectError as error:
        # It was listening a moment ago: an engine that has just stopped is gone, not
        # a stranger (the path is then a stale socket that the next engine replaces).
        if not _someone_listens(socket_path):
            return None
        raise _stranger(socket_path, error) from error
    except (httpx.HTTPError, ValueError) as error:
        raise _stranger(socket_path, error) from error
    if health.service != SERVICE:
        raise NotAnEngineError(
            f"{socket_path} answers as {health.service!r}, not as a draftpen engine. Stop "
            f"that program, or set {SOCKET_ENV} to another socket path for draftpen."
        )
    if health.api_version != API_VERSION:
        raise EngineVersionError(
            f"The draftpen engine on {socket_path} (version {health.version}, pid "
            f"{health.pid}) speaks API {health.api_version}; this draftpen speaks API "
            f"{API_VERSION}. Stop that engine (kill {health.pid}, or systemctl --user "
            "restart draftpen for the service) and this one starts its own."
        )
    client.engine_pid = health.pid
    return client


def ensure_engine(
    settings: Settings,
    on_status: Callable[[str], None] | None = None,
    *,
    socket_path: Path | None = None,
    serve_options: Sequence[str] = (),
    start_seconds: float = DEFAULT_START_SECONDS,
) -> EngineClient:
    """The engine on the socket; one is started (and waited for) if none runs.

    ``settings`` are the caller's (the engine reads the same settings file for its own
    defaults); ``serve_options`` are passed to ``draftpen serve`` after ``--idle-exit``
    (tests shorten the idle time). ``on_status`` hears what is happening, in a line.
    """
    del settings  # the engine reads the same settings file; kept for the contract
    path = socket_path if socket_path is not None else default_socket_path()
    report = on_status or (lambda text: None)
    client = find_engine(path)
    if client is not None and _stopping(client):
        # An engine that is going away (idle exit, SIGTERM): wait for it, start anew.
        report(f"The draftpen engine on {path} is stopping; waiting to start a new one")
        deadline = time.monotonic() + start_seconds
        while client is not None and time.monotonic() < deadline:
            time.sleep(0.1)
            client = find_engine(path)
    if client is not None:
        return client
    # An engine that crashed twice for this front end is not started a third time.
    refuse_after_crashes(path)
    log_path = engine_log_path()
    report(f"Starting the draftpen engine on {path} (log: {log_path})")
    process = _start_engine(path, log_path, serve_options)
    remember_started(path, process)  # its exit status names the signal if it crashes
    # The engine outlives this call; whenever it exits, reap it so no zombie remains.
    threading.Thread(target=process.wait, name="draftpen-engine-reaper", daemon=True).start()
    deadline = time.monotonic() + start_seconds
    while time.monotonic() < deadline:
        # Another front end may have started one at the same moment: whichever answers.
        client = find_engine(path)
        if client is not None:
            report("The draftpen engine is running")
            return client
        if process.poll() is not None:
            crashed = crash_error(path, pid=process.pid)  # e.g. loading `serve --pair`
            if crashed is not None:
                raise crashed
            raise EngineStartError(
                f"The draftpen engine did not start (exit status {process.returncode}): "
                f"{_last_line(log_path)}. Its log: {log_path}"
            )
        time.sleep(0.1)
    raise EngineStartError(
        f"The draftpen engine did not answer on {path} within {start_seconds:.0f}s. "
        f"Its log: {log_path}"
    )


def _stranger(socket_path: Path, error: Exception) -> NotAnEngineError:
    return NotAnEngineError(
        f"Something that is not a draftpen engine listens on {socket_path} "
        f"({type(error).__name__}). Stop that program, or set {SOCKET_ENV} to another "
        "socket path for draftpen."
    )


def _stopping(client: EngineClient) -> bool:
    """Whether the engine says it is shutting down (or is gone already)."""
    try:
        return client.health().status != "ok"
    except EngineError:
        return True


def _someone_listens(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(5.0)
    try:
        probe.connect(os.fspath(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except TimeoutError:
        return True  # a full backlog: someone is there, just busy
    except PermissionError as error:
        raise NotAnEngineError(
            f"{path} cannot be reached ({error.strerror}); it may belong to another user. "
            f"Set {SOCKET_ENV} to another socket path."
        ) from error
    finally:
        probe.close()
    return True


def _start_engine(
    path: Path, log_path: Path, serve_options: Sequence[str]
) -> subprocess.Popen[bytes]:
    """``draftpen serve --idle-exit --socket PATH`` in its own session, output to the log.

    The log is rotated first if it has grown large; the engine, told where its output
    goes (``--log-file``), rotates it again whenever it grows past the limit.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rotate_log(log_path)
    command = [
        sys.executable,
        "-m",
        "app.main",
        "serve",
        "--idle-exit",
        "--log-file",
        os.fspath(log_path),
        *serve_options,
    ]
    if path != default_socket_path() or os.environ.get(SOCKET_ENV):
        command += ["--socket", os.fspath(path)]
    with log_path.open("ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
        log.flush()
        # Its own session: the engine outlives the front end and its terminal's signals.
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )


def _last_line(log_path: Path) -> str:
    try:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"
