"""The socket's rules, no model needed: the peer's uid, other users refused, stale sockets
replaced, a private runtime directory, a bad TCP address in one line.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import threading
from pathlib import Path

import httpx
import pytest

from app.engine.runner import AgentServer
from app.engine.unix_socket import (
    bind_unix_socket,
    default_socket_path,
    peer_uid,
    prepare_socket_dir,
)
from app.errors import ServerAlreadyRunningError
from app.settings import Settings
from backends.engine import Engine
from tests.support.draftpen_cli import assert_clean_error, run_draftpen
from tests.support.fakes import HashModel
from tests.support.serve_process import (
    PAIR,
)

# -- the socket's rules, no model needed --------------------------------------------------


def test_peer_uid_is_read_from_the_socket():
    if not hasattr(socket, "SO_PEERCRED"):
        pytest.skip("SO_PEERCRED is Linux only")
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        assert peer_uid(left) == os.getuid()


def test_connection_from_another_uid_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    if not hasattr(socket, "SO_PEERCRED"):
        pytest.skip("SO_PEERCRED is Linux only")
    engine = Engine(HashModel())
    path = tmp_path / "peer.sock"
    server = AgentServer(
        engine,
        model_id="fake",
        socket_path=path,
        settings=Settings(drafter="none"),
        allowed_uid=os.getuid() + 1,
        configure_logging=False,
    )
    listening = threading.Event()
    thread = threading.Thread(target=server.run, kwargs={"announce": lambda _: listening.set()})
    thread.start()
    try:
        assert listening.wait(10)
        transport = httpx.HTTPTransport(uds=str(path))
        with httpx.Client(transport=transport) as client, pytest.raises(httpx.TransportError):
            client.get("http://draftpen/health")
    finally:
        server.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert f"refused a connection from uid {os.getuid()}" in caplog.text
    assert not path.exists()


def test_stale_socket_is_replaced_and_a_live_one_is_not(tmp_path: Path):
    path = tmp_path / "s.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: what a crashed server leaves
    live = bind_unix_socket(path)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with pytest.raises(ServerAlreadyRunningError, match=f"already running on {path}"):
            bind_unix_socket(path)
    finally:
        live.close()


def test_default_socket_lives_in_a_private_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("DRAFTPEN_HOME")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = default_socket_path()
    assert path == tmp_path / "draftpen" / "draftpen.sock"
    (tmp_path / "draftpen").mkdir(mode=0o755)
    prepare_socket_dir(path, private=True)
    assert stat.S_IMODE((tmp_path / "draftpen").stat().st_mode) == 0o700

    monkeypatch.delenv("XDG_RUNTIME_DIR")
    if sys.platform == "linux":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        fallback = default_socket_path()
        assert fallback == tmp_path / "cache" / "draftpen" / "run" / "draftpen.sock"
        prepare_socket_dir(fallback, private=True)
        assert stat.S_IMODE(fallback.parent.stat().st_mode) == 0o700


def test_bad_tcp_address_is_one_line():
    result = run_draftpen("serve", "--pair", PAIR, "--tcp", "localhost")
    assert_clean_error(result, "--tcp wants HOST:PORT")
