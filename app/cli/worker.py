"""``draftpen worker``: lend this machine's memory and compute to a draftpen elsewhere.

A worker is llama.cpp's RPC server, started from the llama.cpp library this draftpen
installed (``backends/llamacpp/ggml_devices.py``), so its protocol is exactly the one a
main machine with the same draftpen speaks. The main machine (``draftpen serve --workers
HOST:PORT``) puts part of its target's layers here; the draft model stays there.

ggml's RPC has no authentication: anyone who reaches the port can run computations and
read what it holds. So a worker listens on loopback unless told otherwise, and another
address needs ``--allow-network``; the safe ways in are an SSH tunnel or a private LAN.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
from typing import TextIO

from app.errors import DraftpenError
from app.settings import cache_dir
from backends.workers import keepalive
from backends.workers.endpoints import DEFAULT_WORKER_PORT, Endpoint, is_loopback

# Exit codes: 0 stopped by Ctrl-C or SIGTERM; 1 the server could not start.
EXIT_COULD_NOT_SERVE = 1

SAFE_WAYS = (
    "ggml's RPC has no authentication: whoever reaches the port can use this machine's "
    "memory and compute and read the model's weights. Keep it on a network only you use "
    "(a private LAN, a VPN such as WireGuard or Tailscale), or keep the worker on "
    "127.0.0.1 and reach it through SSH: on the main machine, `ssh -N -L "
    "50052:127.0.0.1:50052 you@this-machine`, then `draftpen serve --workers "
    "127.0.0.1:50052`."
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``worker`` command."""
    worker = subparsers.add_parser(
        "worker",
        help="lend this machine to a draftpen elsewhere: it holds part of a target's layers",
        description="Run llama.cpp's RPC server from this draftpen's own llama.cpp, so a "
        "main machine (draftpen serve --workers HOST:PORT) can split a target too big for "
        "it across both. It listens on 127.0.0.1 unless told otherwise. " + SAFE_WAYS,
    )
    worker.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    worker.add_argument(
        "--port", type=int, default=DEFAULT_WORKER_PORT, help=f"default {DEFAULT_WORKER_PORT}"
    )
    worker.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: the physical cores)"
    )
    worker.add_argument(
        "--cache",
        action="store_true",
        help="keep the weights a main machine sends in draftpen's cache directory, so a "
        "reload sends only their hashes",
    )
    worker.add_argument(
        "--allow-network",
        action="store_true",
        help="allow --host to be an address other machines reach (read the warning first)",
    )
    worker.set_defaults(func=run_worker)


def check_address(host: str, port: int, allow_network: bool) -> Endpoint:
    """The address to listen on, refused where it is not loopback without the flag."""
    if not 0 < port < 65536:
        raise DraftpenError(f"--port must be 1-65535, not {port}.")
    if ":" in host:
        raise DraftpenError("llama.cpp's RPC listens on an IPv4 address or a host name.")
    if not is_loopback(host) and not allow_network:
        raise DraftpenError(
            f"Refusing to listen on {host}: {SAFE_WAYS} To listen there anyway, add "
            "--allow-network."
        )
    return Endpoint(host, port)


def _port_is_free(endpoint: Endpoint) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((endpoint.host, endpoint.port))
        except OSError:
            return False
    return True


def run_worker(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Serve until Ctrl-C (or SIGTERM); the exit code says how it ended."""
    from backends.llamacpp import ggml_devices
    from backends.llamacpp.library import physical_cores
    from backends.workers.wire import PROTOCOL, version_text

    endpoint = check_address(args.host, args.port, args.allow_network)
    if args.threads is not None and args.threads < 1:
        raise DraftpenError("--threads must be 1 or more.")
    if not ggml_devices.supports_rpc():
        raise DraftpenError(
            "This llama-cpp-python has no RPC backend, which a worker needs. Run "
            "packaging/install.sh again: it builds llama.cpp with -DGGML_RPC=ON."
        )
    if not _port_is_free(endpoint):
        raise DraftpenError(
            f"Cannot listen on {endpoint}: the port is in use (another worker?) or the "
            "address is not this machine's. Choose another with --port or --host."
        )
    threads = args.threads or physical_cores()
    cache = cache_dir() / "rpc" if args.cache else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    if not is_loopback(endpoint.host):
        print(
            f"warning: listening on {endpoint}, reachable from the network. {SAFE_WAYS}",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"draftpen worker on {endpoint} (llama.cpp RPC {version_text(PROTOCOL)}, "
        f"{threads} threads{', weights cached in ' + str(cache) if cache else ''}).\n"
        f"On the main machine: draftpen serve --workers {_reachable_as(endpoint)}\n"
        "Ctrl-C stops it.",
        file=out,
        flush=True,
    )
    ended = threading.Event()

    def serve() -> None:
        ggml_devices.serve_as_worker(endpoint, threads=threads, cache_dir=cache)
        ended.set()  # it returns only when it could not listen or accept

    # A main machine that vanishes mid-connection would hold the server forever.
    keepalive.watch(lambda local, remote: local[1] == endpoint.port)
    threading.Thread(target=serve, name="draftpen-worker", daemon=True).start()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        while not stop.is_set() and not ended.is_set():
            stop.wait(0.2)
    except KeyboardInterrupt:
        stop.set()
    finally:
        signal.signal(signal.SIGTERM, previous)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    if ended.is_set():
        print(f"draftpen worker: the server on {endpoint} stopped (see above).", file=sys.stderr)
        os._exit(EXIT_COULD_NOT_SERVE)
    print("draftpen worker stopped.", file=out, flush=True)
    # The server thread is blocked in llama.cpp's accept loop, which has no stop call:
    # end the process here (nothing is written by a worker that a stop could lose).
    os._exit(0)


def _reachable_as(endpoint: Endpoint) -> str:
    if is_loopback(endpoint.host):
        tunnel = f"ssh -N -L {endpoint.port}:{endpoint} you@this-machine"
        return f"{endpoint} (from another machine: through `{tunnel}`)"
    if endpoint.host == "0.0.0.0":
        return f"THIS-MACHINE'S-ADDRESS:{endpoint.port}"
    return str(endpoint)
