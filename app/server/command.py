"""``draftpen serve``: an OpenAI-compatible API for local agents, on a Unix socket.

Prints one line on stdout once it listens (``draftpen serve: listening on unix:PATH``),
logs to stderr, and runs until SIGTERM or Ctrl+C; then it cancels what is generating,
removes its socket and exits 0 (130 after Ctrl+C).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from app.errors import DraftpenError
from app.options import add_model_options
from app.server.queue import DEFAULT_QUEUE_LIMIT


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``serve`` command."""
    serve = subparsers.add_parser(
        "serve", help="serve an OpenAI-compatible API to local agents on a Unix socket"
    )
    add_model_options(serve)  # --pair, --context, --runtime, --target, --draft
    serve.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help="socket path (default: $XDG_RUNTIME_DIR/draftpen/draftpen.sock, "
        "else a private directory under draftpen's cache)",
    )
    serve.add_argument(
        "--queue",
        type=int,
        default=DEFAULT_QUEUE_LIMIT,
        metavar="N",
        help="requests that may wait behind the one generating; more get 503 "
        f"(default {DEFAULT_QUEUE_LIMIT})",
    )
    serve.add_argument(
        "--tcp",
        default=None,
        metavar="HOST:PORT",
        help="also listen on TCP, e.g. 127.0.0.1:8080 (no peer check: any process "
        "that reaches the address may use the model)",
    )
    serve.set_defaults(func=run_serve)


def parse_tcp_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) to a (host, port) pair."""
    host, separator, port_text = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise DraftpenError(f"--tcp wants HOST:PORT, such as 127.0.0.1:8080, not {value!r}.")
    return host, int(port_text)


def run_serve(args: argparse.Namespace) -> int:
    """``draftpen serve``: load the pair, listen, serve until stopped."""
    from app.loading import load_engine
    from app.server.runner import AgentServer
    from app.server.unix_socket import default_socket_path, ensure_not_running, prepare_socket_dir
    from app.settings import load_settings

    settings = load_settings()
    pair = args.pair or settings.default_pair
    if args.queue < 0:
        raise DraftpenError("--queue must be 0 or more.")
    if args.context is not None and args.context < 16:
        raise DraftpenError("--context must be at least 16 tokens.")
    tcp = parse_tcp_address(args.tcp) if args.tcp else None
    if args.socket:
        socket_path = Path(args.socket).expanduser().absolute()
        prepare_socket_dir(socket_path, private=False)
    else:
        socket_path = default_socket_path()
        prepare_socket_dir(socket_path, private=True)
    # Refuse before the slow part: loading a model only to find the place taken.
    ensure_not_running(socket_path)

    # SIGTERM (systemd, launchd, kill) means "stop cleanly": while serving, uvicorn
    # handles it; before that, this flag stops the server as soon as it starts.
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        engine = load_engine(
            pair,
            n_ctx=args.context or settings.context_length,
            runtime=args.runtime,
            with_draft=True,
            calibrate=True,
            exact_output=settings.exact_output,
            on_progress=lambda message: print(f"draftpen serve: {message}", file=sys.stderr),
        )
        server: AgentServer | None = None
        try:
            server = AgentServer(
                engine,
                model_id=pair,
                socket_path=socket_path,
                settings=settings,
                queue_limit=args.queue,
                tcp=tcp,
                stop=stop,
            )
            if not stop.is_set():
                server.run(announce=_announce(pair, engine.draft is not None))
        finally:
            # A generation stuck in one long call still uses the models: leave them to
            # the process exit rather than free them under it.
            if server is None or server.worker_stopped:
                engine.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _announce(pair: str, has_draft: bool) -> Callable[[str], None]:
    def announce(address: str) -> None:
        if address.startswith("unix:"):
            # The one line on stdout: scripts and tests wait for it.
            print(f"draftpen serve: listening on {address}", flush=True)
            path = address.removeprefix("unix:")
            drafting = "draft model + n-gram" if has_draft else "n-gram only, no draft model"
            print(
                f"draftpen serve: model '{pair}' ({drafting}); try: "
                f"curl --unix-socket {path} http://draftpen/v1/models",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(
                f"draftpen serve: also listening on {address}/v1 - no peer check on TCP: "
                "any process that can reach this address can use the model",
                file=sys.stderr,
                flush=True,
            )

    return announce
