"""A TCP proxy that adds a fixed one-way delay each way: network latency without netem.

This machine's kernel has no ``sch_netem`` (``tc qdisc add ... netem`` answers "Specified
qdisc kind is unknown"), so the latency between a main machine and its workers is added
here, in user space: every chunk read from one side is written to the other ``delay``
seconds after it arrived, in order. A round trip through the proxy therefore costs
``2 * delay`` more (plus the proxy's own ~0.1 ms, measured by :func:`round_trip`).
Bandwidth is not limited: an RPC forward moves a few kB of activations.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

CHUNK = 1 << 16


def _pump(source: socket.socket, target: socket.socket, delay: float) -> None:
    pending: queue.Queue[tuple[float, bytes] | None] = queue.Queue()

    def read() -> None:
        try:
            while data := source.recv(CHUNK):
                pending.put((time.monotonic() + delay, data))
        except OSError:
            pass
        pending.put(None)

    def write() -> None:
        while (item := pending.get()) is not None:
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                target.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    for job in (read, write):
        threading.Thread(target=job, daemon=True).start()


class LatencyProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to ``upstream`` with ``delay``."""

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream = upstream
        self.delay = delay
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            for connection in (client, upstream):
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _pump(client, upstream, self.delay)
            _pump(upstream, client, self.delay)

    def close(self) -> None:
        self.server.close()


def round_trip(address: tuple[str, int], samples: int = 20) -> float:
    """Median seconds for one byte there and back through an echo behind ``address``'s
    kind of proxy (call it on a proxy in front of :func:`echo_server`)."""
    times = []
    with socket.create_connection(address) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(samples):
            started = time.perf_counter()
            connection.sendall(b"x")
            connection.recv(1)
            times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def echo_server() -> tuple[str, int]:
    """A loopback echo server (for measuring a proxy's round trip)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            connection, _ = server.accept()

            def echo(connection: socket.socket = connection) -> None:
                with connection:
                    while data := connection.recv(CHUNK):
                        connection.sendall(data)

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()
