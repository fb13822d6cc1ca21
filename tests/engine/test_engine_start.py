"""Finding or starting the engine as a front end does (:func:`app.client.ensure_engine`):
a stale socket replaced, a socket another program holds refused naming the fix, an
engine of another API version refused, an engine that is stopping waited out, a killed
one started again.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import socketserver
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from app.client import (
    ChatTurn,
    EngineLost,
    EngineVersionError,
    NotAnEngineError,
    engine_log_path,
    ensure_engine,
)
from app.client.wire import API_VERSION
from app.settings import Settings
from backends.base import ChatMessage
from backends.generation_events import GenerationEvent
from tests.support.draftpen_cli import assert_clean_error, run_draftpen
from tests.support.engine_fixtures import scripted_engine_server, wait_until
from tests.support.engine_process import (
    GREEDY,
    PAIR,
    chat_text,
    pid_alive,
    short_socket,
    stop_engine,
)
from tests.support.model_files import SMOLLM2_KEY, require_model

# -- starting, finding, refusing: no model needed ----------------------------------------


def test_ensure_engine_starts_one_over_a_stale_socket_and_it_stops_when_idle_and_detached(
    engine_home: Path,
):
    path = short_socket("autostart")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a crashed engine leaves

    statuses: list[str] = []
    client = ensure_engine(
        Settings(), statuses.append, socket_path=path, serve_options=["--idle-exit", "3s"]
    )
    with client.attach():
        # Attached at once: on a busy machine the checks below may outlast --idle-exit.
        health = client.health()
        assert statuses and statuses[0].startswith(f"Starting the draftpen engine on {path}")
        assert health.service == "draftpen" and health.api_version == API_VERSION
        assert health.loaded == [] and health.idle_exit
        assert "listening on unix:" in engine_log_path().read_text()

        statuses.clear()
        again = ensure_engine(Settings(), statuses.append, socket_path=path)
        assert again.health().pid == health.pid and statuses == []  # found, not started

        time.sleep(3.5)  # longer than --idle-exit: an attached front end keeps it
        assert client.health().attached_clients == 1
    wait_until(lambda: not pid_alive(health.pid), "the idle engine to stop", seconds=20)
    assert not path.exists()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the server's ``body`` and ``status``."""

    def do_GET(self) -> None:
        status, body, kind = self.server.answer  # type: ignore[attr-defined]
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def address_string(self) -> str:
        return "unix"


class _UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve_http_on(path: Path, status: int, body: str, kind: str) -> _UnixHttpServer:
    """Another program's HTTP server on the socket path."""
    server = _UnixHttpServer(str(path), _Handler)
    server.answer = (status, body, kind)  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_socket_held_by_another_program_is_refused_naming_the_fix(engine_home: Path):
    path = short_socket("other")
    path.unlink(missing_ok=True)
    other = serve_http_on(path, 404, "<html>not here</html>", "text/html")
    try:
        with pytest.raises(NotAnEngineError, match="not a draftpen engine") as refused:
            ensure_engine(Settings(), socket_path=path)
        assert "DRAFTPEN_SOCKET" in str(refused.value) and str(path) in str(refused.value)
    finally:
        other.shutdown()
        other.server_close()
        path.unlink(missing_ok=True)

    # A program that is not speaking HTTP at all.
    mute = socket.socket(socket.AF_UNIX)
    mute.bind(str(path))
    mute.listen()

    def hang_up() -> None:
        while True:
            try:
                connection, _ = mute.accept()
            except OSError:
                return  # closed by the test
            with connection, contextlib.suppress(OSError):
                connection.sendall(b"SSH-2.0-OpenSSH\r\n")

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        with pytest.raises(NotAnEngineError, match="not a draftpen engine"):
            ensure_engine(Settings(), socket_path=path)
    finally:
        mute.close()
        path.unlink(missing_ok=True)

    path.write_text("a file, not a socket")
    with pytest.raises(NotAnEngineError, match=r"is not a socket.*Remove it"):
        ensure_engine(Settings(), socket_path=path)
    assert path.read_text() == "a file, not a socket"  # nothing of someone else's is touched


def test_an_engine_of_another_api_version_is_refused_naming_how_to_stop_it(engine_home: Path):
    path = short_socket("version")
    path.unlink(missing_ok=True)
    health = {
        "service": "draftpen",
        "status": "ok",
        "version": "9.0.0",
        "api_version": API_VERSION + 1,
        "pid": 4242,
    }
    old = serve_http_on(path, 200, json.dumps(health), "application/json")
    try:
        with pytest.raises(EngineVersionError, match="speaks API") as refused:
            ensure_engine(Settings(), socket_path=path)
    finally:
        old.shutdown()
        old.server_close()
        path.unlink(missing_ok=True)
    message = str(refused.value)
    assert "kill 4242" in message and "9.0.0" in message and f"API {API_VERSION}" in message


@pytest.mark.real_model
def test_an_engine_killed_mid_reply_raises_engine_lost_and_a_new_one_starts(engine_home: Path):
    require_model(SMOLLM2_KEY)
    path = short_socket("killed")
    client = ensure_engine(Settings(), socket_path=path)
    pid = client.health().pid
    client.load(PAIR)
    long_reply = ChatTurn(
        PAIR,
        (ChatMessage("user", "Count from 1 to 500, one number a line."),),
        GREEDY,
        max_tokens=2000,
        drafter="none",
    )
    received: list[Any] = []
    with pytest.raises(EngineLost, match="Lost the draftpen engine"):
        for item in client.chat(long_reply):
            received.append(item)
            if sum(isinstance(i, GenerationEvent) for i in received) == 3:
                os.kill(pid, signal.SIGKILL)
    assert chat_text(received)  # what came before the loss is kept by the caller
    wait_until(lambda: not pid_alive(pid), "the killed engine to be gone")

    restarted = ensure_engine(Settings(), socket_path=path)  # over the dead one's socket
    try:
        assert restarted.health().pid != pid
    finally:
        stop_engine(restarted)


def test_serve_refuses_a_socket_another_program_holds(engine_home: Path):
    path = short_socket("serve-other")
    path.unlink(missing_ok=True)
    other = serve_http_on(path, 404, "<html>not here</html>", "text/html")
    try:
        result = run_draftpen("serve", "--socket", str(path))
    finally:
        other.shutdown()
        other.server_close()
        path.unlink(missing_ok=True)
    assert_clean_error(result, "not a draftpen engine", str(path))


def test_ensure_engine_waits_out_an_engine_that_is_stopping_then_starts_one(
    engine_home: Path, tmp_path: Path
):
    with scripted_engine_server(tmp_path) as stopping:
        stopping.server.queue.shutdown()  # what SIGTERM or --idle-exit starts with
        assert stopping.client().health().status == "shutting_down"
        statuses: list[str] = []

        def hear(text: str) -> None:
            statuses.append(text)
            # Stop the old engine only once ensure_engine has seen it stopping, so a
            # slow machine cannot let it vanish before it is looked at.
            if len(statuses) == 1:
                threading.Timer(0.5, stopping.server.stop).start()

        client = ensure_engine(Settings(), hear, socket_path=stopping.socket_path)
    try:
        health = client.health()
        assert health.status == "ok" and health.pid != os.getpid()  # a new engine process
        assert "is stopping" in statuses[0] and "Starting the draftpen engine" in statuses[1]
    finally:
        stop_engine(client)
