"""The socket of ``draftpen serve``: where it lives, who may connect, and its lifetime.

The default socket is ``$XDG_RUNTIME_DIR/draftpen/draftpen.sock`` (or the same name
in a private directory under draftpen's cache), in a 0700 directory, with mode 0600
from the moment it is bound. On Linux each connection's peer uid is also checked
(SO_PEERCRED) when it is accepted, so other users are refused even if someone loosens
the file modes. A socket left by a dead server is replaced; a live one is not.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import stat
import struct
import sys
from pathlib import Path
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

# Where the socket lives by default is the wire's to say: clients look there too.
from app.client.wire import default_socket_path as default_socket_path
from app.errors import ServeError, ServerAlreadyRunningError

logger = logging.getLogger("draftpen.server")

# sockaddr_un.sun_path holds 108 bytes on Linux and 104 on macOS, with the NUL.
_MAX_SOCKET_PATH_BYTES = 103 if sys.platform == "darwin" else 107


def prepare_socket_dir(path: Path, *, private: bool) -> None:
    """Create the socket's directory (0700); ``private`` also tightens an existing one.

    The default directory must be ours and closed to others; a directory the user
    names with ``--socket`` is created if missing but otherwise left as it is.
    """
    directory = path.parent
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not private:
            return
        info = directory.lstat()
        if not stat.S_ISDIR(info.st_mode):
            raise ServeError(f"{directory} is not a directory; remove it or pass --socket PATH.")
        if info.st_uid != os.getuid():
            raise ServeError(
                f"{directory} belongs to another user (uid {info.st_uid}); "
                "remove it or pass --socket PATH."
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            directory.chmod(0o700)
    except OSError as error:
        raise ServeError(
            f"Cannot create {directory} for the socket: {error.strerror}. Pass --socket PATH."
        ) from error


def socket_state(path: Path) -> str:
    """Whether ``path`` is "absent", "stale" (a socket nobody listens on) or "live"."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return "absent"
    if not stat.S_ISSOCK(info.st_mode):
        raise ServeError(f"{path} exists and is not a socket; remove it or pass another --socket.")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(os.fspath(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return "stale"
    except TimeoutError:
        return "live"  # a full backlog: someone is there, just busy
    except PermissionError as error:
        raise ServeError(
            f"{path} exists and cannot be reached ({error.strerror}); it may belong to "
            "another user. Pass another --socket."
        ) from error
    finally:
        probe.close()
    return "live"


def ensure_not_running(path: Path) -> None:
    """Raise :class:`ServerAlreadyRunningError` if a server answers on ``path``."""
    if socket_state(path) == "live":
        raise ServerAlreadyRunningError(os.fspath(path))


def bind_unix_socket(path: Path, *, backlog: int = 128) -> socket.socket:
    """A listening socket at ``path``, mode 0600; a stale socket there is replaced."""
    encoded = os.fsencode(path)
    if len(encoded) > _MAX_SOCKET_PATH_BYTES:
        raise ServeError(
            f"The socket path {path} is {len(encoded)} bytes; Unix sockets allow "
            f"{_MAX_SOCKET_PATH_BYTES}. Pass a shorter --socket."
        )
    state = socket_state(path)
    if state == "live":
        raise ServerAlreadyRunningError(os.fspath(path))
    if state == "stale":
        logger.info("replacing the stale socket %s (no server was listening)", path)
        path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # Created 0600 from the start: no moment when another user could connect.
        previous_umask = os.umask(0o177)
        try:
            listener.bind(encoded)
        finally:
            os.umask(previous_umask)
        os.chmod(path, 0o600)
        listener.listen(backlog)
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRINUSE:
            raise ServerAlreadyRunningError(os.fspath(path)) from error
        raise ServeError(
            f"Cannot listen on {path}: {error.strerror}. Pass another --socket."
        ) from error
    return listener


def bind_tcp_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket, for ``--tcp HOST:PORT`` only."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as error:
        raise ServeError(
            f"Cannot listen on {host}:{port}: {error.strerror}. Pick another --tcp address."
        ) from error


def peer_uid(sock: Any) -> int | None:
    """The uid of the process at the other end of a Unix socket (Linux), else None.

    ``sock`` is a socket or asyncio's TransportSocket wrapper around one.
    """
    if sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    size = struct.calcsize("3i")
    credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, size)
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return uid


def peer_checked_protocol(allowed_uid: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, closing Unix connections from any uid but ``allowed_uid``.

    The check runs when a connection is accepted, before a byte of HTTP is read. It
    needs SO_PEERCRED (Linux); elsewhere the socket's 0600 mode and 0700 directory
    are the guard.
    """

    class PeerCheckedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            try:
                uid = peer_uid(sock) if sock is not None else None
            except OSError:
                uid = -1  # cannot tell who it is: refuse
            if uid is not None and uid != allowed_uid:
                logger.warning(
                    "refused a connection from uid %d: this server only serves uid %d",
                    uid,
                    allowed_uid,
                )
                transport.close()

    return PeerCheckedH11Protocol


def remove_socket_if_ours(path: Path, identity: tuple[int, int]) -> None:
    """Remove the socket at ``path`` if it is still the one identified by (dev, inode).

    Another server may have replaced a socket it judged stale; that one stays.
    """
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if (info.st_dev, info.st_ino) == identity:
        path.unlink(missing_ok=True)
