"""TCP keepalive on the connections between a main machine and its workers.

ggml's RPC sockets have no timeouts: a main machine waiting for a worker's answer, or a
worker waiting for the main machine's next command, waits forever if the other machine
vanishes (power cut, cable, sleep) without closing the connection. Both sides therefore
find their RPC connections every few seconds (this process's sockets, through psutil)
and switch keepalive on, so the kernel gives up on a silent peer after about
``IDLE + INTERVAL * COUNT`` seconds, or when sent data stays unacknowledged for
``USER_TIMEOUT_MS``: the waiting call then fails (llama.cpp on the main machine aborts
the engine, which says which worker was lost; a worker goes back to accepting). A peer
that is alive acknowledges keepalives even while it computes, however long that takes.
Socket options belong to the socket, so setting them through a duplicate of its
descriptor changes the one llama.cpp uses.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable

import psutil

IDLE_SECONDS = 5
INTERVAL_SECONDS = 2
COUNT = 3
USER_TIMEOUT_MS = 20_000
SCAN_SECONDS = 2.0

# (local address, remote address) -> whether the connection is an RPC one to watch.
Matcher = Callable[[tuple[str, int], tuple[str, int]], bool]


def keep_alive(fd: int) -> None:
    """Switch keepalive on for the socket behind ``fd`` (Linux's options where present)."""
    duplicate = os.dup(fd)
    try:
        with socket.socket(fileno=duplicate) as connection:
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in (
                ("TCP_KEEPIDLE", IDLE_SECONDS),
                ("TCP_KEEPINTVL", INTERVAL_SECONDS),
                ("TCP_KEEPCNT", COUNT),
                ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
            ):
                option = getattr(socket, name, None)
                if option is not None:
                    connection.setsockopt(socket.IPPROTO_TCP, option, value)
            connection.detach()
    finally:
        with contextlib.suppress(OSError):
            os.close(duplicate)


def keep_alive_matching(match: Matcher) -> int:
    """Keepalive on every established TCP connection of this process ``match`` accepts;
    how many there were."""
    count = 0
    for connection in psutil.Process().net_connections(kind="tcp"):
        if connection.status != psutil.CONN_ESTABLISHED or connection.fd < 0:
            continue
        if not connection.raddr or not match(tuple(connection.laddr), tuple(connection.raddr)):
            continue
        with contextlib.suppress(OSError):
            keep_alive(connection.fd)
            count += 1
    return count


def watch(
    match: Matcher,
    *,
    active: Callable[[], bool] = lambda: True,
    stop: threading.Event | None = None,
) -> threading.Thread:
    """A daemon thread that applies :func:`keep_alive_matching` every few seconds, while
    ``active()`` says there may be connections to watch."""
    stopped = stop or threading.Event()

    def loop() -> None:
        while not stopped.wait(SCAN_SECONDS):
            if active():
                with contextlib.suppress(psutil.Error, OSError):
                    keep_alive_matching(match)

    thread = threading.Thread(target=loop, name="draftpen-rpc-keepalive", daemon=True)
    thread.start()
    return thread


def addresses_of(host: str) -> set[str]:
    """The IP addresses ``host`` names (itself if it is one)."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except OSError:
        return {host}
