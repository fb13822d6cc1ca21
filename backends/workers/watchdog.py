"""The watchdog that breaks a connection to a hung worker, so llama.cpp stops waiting.

llama.cpp's RPC client talks to each worker from a thread of its own, over one socket,
with blocking reads and no timeout (ggml-rpc.cpp's ``rpc_dispatcher``). A worker whose
process hangs while its kernel still acknowledges TCP keeps that thread, and the
forward pass waiting on it, blocked forever. Every second this thread looks at the
runtime call in flight (``hang.RuntimeCalls``, fed by ``ggml_devices.decode``); once it
has waited past its bound (``hang``), it asks the system which worker connection a
thread of this process is blocked on (Linux: ``/proc/self/task/*/syscall`` names the
call and its descriptor) and how long each worker has been silent (``TCP_INFO``'s
last data received), writes down its verdict (:func:`verdicts`, which the engine's
abort hook puts in the crash record), and shuts that connection down. llama.cpp's
read then fails and it aborts the engine, as for a worker that was killed.

Outside a timed call (a load, a state save), a thread blocked on a worker that has been
silent for ``hang.FIRST_FACTOR`` times the floor is a hang too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from backends.workers.endpoints import Endpoint
from backends.workers.hang import FIRST_FACTOR, Connection, RuntimeCalls, hung, why

logger = logging.getLogger("draftpen.workers")

TICK_SECONDS = 1.0
# A look outside a timed call costs a read of every thread's syscall file: not each tick.
UNTIMED_EVERY = 5
# The system calls a thread blocked on a socket is in, by machine (first argument: the
# descriptor), Linux's numbering: read, recvfrom, recvmsg -> True (receiving); write,
# sendto, sendmsg -> False (sending).
_SOCKET_CALLS = {
    "x86_64": {0: True, 45: True, 47: True, 1: False, 44: False, 46: False},
    "aarch64": {63: True, 207: True, 212: True, 64: False, 206: False, 211: False},
}
# struct tcp_info (linux/tcp.h): tcpi_last_data_sent at byte 44, tcpi_last_data_recv at
# 52, in milliseconds.
_TCP_INFO_BYTES = 60

calls = RuntimeCalls()  # the split target's runtime calls (ggml_devices.decode)
# Endpoint -> why it was called hung; read by the engine's abort hook.
_verdicts: dict[Endpoint, str] = {}
_broken: set[int] = set()  # descriptors already shut down
_lock = threading.Lock()

# The worker a remote address belongs to (None: not a worker's).
Locator = Callable[[tuple[str, int]], Endpoint | None]


def verdicts() -> dict[Endpoint, str]:
    """The workers this watchdog called hung, and why (for the crash record)."""
    with _lock:
        return dict(_verdicts)


def waiting_descriptors(task_dir: Path = Path("/proc/self/task")) -> dict[int, bool] | None:
    """The descriptors threads of this process are blocked on now, each with whether a
    thread receives on it (else sends); None where the system does not say (no /proc,
    another machine type)."""
    numbers = _SOCKET_CALLS.get(platform.machine())
    if numbers is None or not task_dir.is_dir():
        return None
    found: dict[int, bool] = {}
    for task in task_dir.iterdir():
        try:
            fields = (task / "syscall").read_text().split()
        except OSError:
            continue  # the thread ended meanwhile, or the file cannot be read
        # "running", "-1 sp pc" (not in a system call), or "nr arg1 ... arg6 sp pc".
        if len(fields) >= 2 and fields[0].isdigit() and int(fields[0]) in numbers:
            fd = int(fields[1], 16)
            found[fd] = found.get(fd, False) or numbers[int(fields[0])]
    return found


def silence(fd: int) -> tuple[float | None, bool | None]:
    """Seconds since the peer of the socket behind ``fd`` last sent data, and whether data
    was sent to it since; (None, None) where the system does not say."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None or platform.system() != "Linux":
        return None, None
    duplicate = os.dup(fd)
    try:
        with socket.socket(fileno=duplicate) as connection:
            try:
                info = connection.getsockopt(socket.IPPROTO_TCP, option, _TCP_INFO_BYTES)
            finally:
                connection.detach()
    except OSError:
        return None, None
    finally:
        with contextlib.suppress(OSError):
            os.close(duplicate)
    if len(info) < _TCP_INFO_BYTES:
        return None, None
    (sent_ms,) = struct.unpack_from("<I", info, 44)
    (received_ms,) = struct.unpack_from("<I", info, 52)
    # Both count back from now: the smaller, the more recent.
    return received_ms / 1000, sent_ms < received_ms


def worker_connections(locate: Locator) -> list[tuple[Endpoint, int]]:
    """This process's established connections to workers: (worker, descriptor)."""
    found = []
    for connection in psutil.Process().net_connections(kind="tcp"):
        if connection.status != psutil.CONN_ESTABLISHED or connection.fd < 0:
            continue
        endpoint = locate(tuple(connection.raddr)) if connection.raddr else None
        if endpoint is not None:
            found.append((endpoint, connection.fd))
    return found


def gather(locate: Locator, *, receiving_only: bool = False) -> list[Connection]:
    """What the system says of each connection to a worker. ``receiving_only``: a thread
    sending to a worker does not count as waiting on it (a load sends weights for
    minutes, and the worker answers none of them)."""
    waiting = waiting_descriptors()
    gathered = []
    for endpoint, fd in worker_connections(locate):
        silent_for, unanswered = silence(fd)
        waited_on = None
        if waiting is not None:
            waited_on = fd in waiting and (waiting[fd] or not receiving_only)
        gathered.append(Connection(endpoint, fd, waited_on, silent_for, unanswered))
    return gathered


def break_connection(fd: int) -> None:
    """Shut down the socket behind ``fd`` both ways: a read blocked on it returns at once
    (through a duplicate: shutting down acts on the socket, not the descriptor)."""
    duplicate = os.dup(fd)
    try:
        with socket.socket(fileno=duplicate) as connection:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            finally:
                connection.detach()
    finally:
        with contextlib.suppress(OSError):
            os.close(duplicate)


def check(locate: Locator, floor: float, now: float, *, untimed: bool) -> list[Connection]:
    """Break the connections of hung workers, now; the ones broken.

    ``untimed``: also look when no timed call is in flight (a wait outside one)."""
    call = calls.oldest()
    if call is not None:
        # A timed call in flight is judged by its own bound alone, long or short.
        bound = calls.bound(call, floor)
        waited = now - call.started
        if waited < bound:
            return []
        found = hung(gather(locate), bound)
    elif untimed:
        bound = waited = floor * FIRST_FACTOR
        found = hung(gather(locate, receiving_only=True), bound, timed=False)
    else:
        return []
    broken = []
    for connection in found:
        with _lock:
            if connection.fd in _broken:
                continue
            _broken.add(connection.fd)
            # Written before the break: the abort that follows reads it.
            _verdicts[connection.endpoint] = why(connection.silent_for, waited)
        logger.error(
            "worker %s %s; breaking its connection (waited %.1f s, bound %.1f s%s)",
            connection.endpoint,
            _verdicts[connection.endpoint],
            waited,
            bound,
            f", a call of {call.tokens} tokens" if call is not None else ", outside a timed call",
        )
        with contextlib.suppress(OSError):
            break_connection(connection.fd)
        broken.append(connection)
    return broken


def watch(
    locate: Locator,
    floor: float,
    *,
    active: Callable[[], bool] = lambda: True,
    stop: threading.Event | None = None,
) -> threading.Thread:
    """A daemon thread that checks every second while ``active()`` says workers hold a
    model's layers (or are being given them); ``floor`` is the worker_timeout setting."""
    stopped = stop or threading.Event()

    def loop() -> None:
        ticks = 0
        while not stopped.wait(min(TICK_SECONDS, floor / 4)):
            ticks += 1
            if not active():
                continue
            try:
                check(locate, floor, time.monotonic(), untimed=ticks % UNTIMED_EVERY == 0)
            except (psutil.Error, OSError) as error:
                logger.warning("the hung-worker watchdog could not look (%s)", error)

    thread = threading.Thread(target=loop, name="draftpen-worker-watchdog", daemon=True)
    thread.start()
    return thread
