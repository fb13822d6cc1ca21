"""``draftpen serve``: the engine. Every front end and agent is its client, over a Unix socket.

It serves the downloaded pairs by name, loading one when a request names it (one pair in
memory at a time) and unloading it after ``--keep-alive`` without work; ``--pair``
loads one before it listens. Started by a front end (``--idle-exit``), it stops when it
has been idle that long with no front end attached; run as a service, it stays.

With ``--tcp`` it also listens on TCP for clients that speak only HTTP (agent CLIs,
through ``draftpen launch``); every request there must carry the API key
(``app.client.api_key``: ``--api-key``, ``$DRAFTPEN_API_KEY``, or a key made once and
kept 0600 in the config directory) unless ``--no-api-key`` says otherwise.

Prints one line on stdout once it listens (``draftpen serve: listening on unix:PATH``),
logs to stderr (both to ``--log-file``, rotated, when given), and runs until SIGTERM or
Ctrl+C; then it cancels what is generating, removes its socket and exits 0 (130 after
Ctrl+C). Started by ``mlx.launch``, it serves an MLX target split across the ranks
(app/engine/mlx_split.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from app.engine.cache_options import (
    add_cache_options,
    conversation_cache_bytes_from,
    history_settings_from,
    prefix_cache_bytes_from,
)
from app.engine.mlx_split import add_split_option, rank_split, run_follower, split_scheduler
from app.engine.queue import DEFAULT_QUEUE_LIMIT
from app.engine.worker_options import (
    add_worker_options,
    worker_timeout_from,
    workers_from,
)
from app.errors import DraftpenError
from app.models.catalog_file import command_line_pairs
from app.models.fit import DEFAULT_PARALLEL
from app.options import add_model_options

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from app.client.api_key import ApiKey
    from app.engine.runtime_wire import RuntimeSpec
    from app.engine.scheduler import LoadOptions, PairLoader, PairScheduler

# Ollama's default keep-alive, and how long an engine started by a front end waits for
# work once the last front end has gone.
DEFAULT_KEEP_ALIVE = "5m"
DEFAULT_IDLE_EXIT = "5m"

_DURATION = re.compile(r"^(?P<number>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h)?$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

# llama.cpp's own bound on sequences in one context is 256; past a handful, a small
# machine gains nothing and each sequence takes a whole context of KV memory.
MAX_PARALLEL = 16


def _parallel_option(value: str) -> int | None:
    """``--parallel``: a count from 1 to MAX_PARALLEL, or "auto" (None)."""
    if value == "auto":
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_PARALLEL:
        raise DraftpenError(f"--parallel must be auto or a number from 1 to {MAX_PARALLEL}.")
    return int(value)


def parse_duration(value: str, option: str) -> float | None:
    """Ollama's durations: ``"5m"``, ``"30s"``, ``"1h"``, ``"90"`` (seconds), ``"0"``;
    a negative number (``"-1"``) means forever (None)."""
    text = value.strip().lower()
    if re.fullmatch(r"-\d+(\.\d+)?[a-z]*", text):
        return None
    match = _DURATION.fullmatch(text)
    if match is None:
        raise DraftpenError(
            f"{option} wants a duration such as 5m, 30s, 1h, 0 (at once) or -1 (never), "
            f"not {value!r}."
        )
    return float(match["number"]) * _UNIT_SECONDS[match["unit"]]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``serve`` command."""
    serve = subparsers.add_parser(
        "serve",
        help="run the engine: an OpenAI-compatible API for the chat app and agents, on a "
        "Unix socket",
        description="Run the engine that the chat app and agents share. It loads the pair "
        "a request names (its 'model') when it is not loaded, one pair at a time.",
    )
    add_model_options(serve)  # --pair, --context, --runtime, --target, --draft
    # The engine reads them its own way: --pair is loaded up front, not a default.
    serve_help = {
        "pair": "a pair to load before listening (default: none; a request's model loads its pair)",
        "context": "context length of the pairs the engine loads (default: from settings; "
        "POST /draftpen/load can reload one with another)",
    }
    for action in serve._actions:
        if action.dest in serve_help:
            action.help = serve_help[action.dest]
    serve.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help="socket path (default: $DRAFTPEN_SOCKET, else "
        "$XDG_RUNTIME_DIR/draftpen/draftpen.sock, else a private directory under "
        "draftpen's cache)",
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
        "--parallel",
        default="auto",
        metavar="N",
        help="generate up to N requests at once, their forwards batched (llama.cpp "
        "and MLX; each sequence gets the whole --context, so the KV cache takes N times the "
        "memory); 1: one at a time; auto: as many as memory holds, up to "
        f"{DEFAULT_PARALLEL} (default auto)",
    )
    serve.add_argument(
        "--tcp",
        default=None,
        metavar="HOST:PORT",
        help="also listen on TCP, e.g. 127.0.0.1:8080 (port 0: a free one), for clients "
        "that speak only HTTP; every request there must carry the API key",
    )
    serve.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="the key TCP clients send as 'Authorization: Bearer KEY' or 'x-api-key: KEY' "
        "(default: $DRAFTPEN_API_KEY, else a random key made once and kept 0600 in "
        "draftpen's config directory, file api-key)",
    )
    serve.add_argument(
        "--no-api-key",
        action="store_true",
        help="let TCP clients in without a key: anyone who can reach the address may use "
        "the model (the Unix socket never needs one)",
    )
    serve.add_argument(
        "--keep-alive",
        default=DEFAULT_KEEP_ALIVE,
        metavar="DURATION",
        help="unload the pair after this long without requests: 5m, 30s, 1h, 0 (as soon "
        f"as the queue is empty), -1 (never) (default {DEFAULT_KEEP_ALIVE})",
    )
    serve.add_argument(
        "--idle-exit",
        nargs="?",
        const=DEFAULT_IDLE_EXIT,
        default=None,
        metavar="DURATION",
        help="stop after this long with no request and no front end attached (how a front "
        f"end starts the engine; default when given alone: {DEFAULT_IDLE_EXIT}). Without "
        "it the engine runs until stopped, as a service does.",
    )
    add_cache_options(serve)  # --conversation-cache, --prefix-cache, --history-index
    serve.add_argument(
        "--log-file",
        default=None,
        metavar="PATH",
        help="write the engine's output to PATH instead of stdout and stderr, moving it to "
        "PATH.1 whenever it passes 4 MiB (how a front end starts the engine: "
        "engine.log in the cache directory)",
    )
    add_worker_options(serve)  # --workers, --worker-split
    add_split_option(serve)  # --mlx-split, for serve under mlx.launch
    serve.set_defaults(func=run_serve)


def parse_tcp_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) to a (host, port) pair."""
    host, separator, port_text = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise DraftpenError(f"--tcp wants HOST:PORT, such as 127.0.0.1:8080, not {value!r}.")
    return host, int(port_text)


def run_serve(args: argparse.Namespace) -> int:
    """``draftpen serve``: (load ``--pair``,) listen, serve until stopped."""
    from app.client.wire import SOCKET_ENV
    from app.engine import crash_record
    from app.engine.pairs import CatalogPairs
    from app.engine.runner import AgentServer
    from app.engine.scheduler import LoadOptions
    from app.engine.serve_runtime import (
        CatalogRuntime,
        build_catalog_runtime,
        runtime_record_path,
        watch_llamacpp,
    )
    from app.engine.unix_socket import default_socket_path, ensure_not_running, prepare_socket_dir
    from app.settings import load_settings
    from backends.select import choose_runtime

    settings = load_settings()
    if args.overlap_drafting is not None:
        settings = dataclasses.replace(settings, overlap_drafting=args.overlap_drafting)
    if args.log_file:
        from app.engine.log_file import RotatingOutput

        output = RotatingOutput(Path(args.log_file).expanduser().absolute())
        output.open()
        output.start_watching()
    if args.queue < 0:
        raise DraftpenError("--queue must be 0 or more.")
    parallel = _parallel_option(args.parallel)
    workers = workers_from(args, settings)  # asked now: a wrong address is said at once
    worker_timeout = worker_timeout_from(args, settings)
    if args.context is not None and args.context < 16:
        raise DraftpenError("--context must be at least 16 tokens.")
    keep_alive = parse_duration(args.keep_alive, "--keep-alive")
    split = rank_split(args)  # None unless serve runs as a rank under mlx.launch
    if split is not None and split.group.rank() != 0:
        return run_follower(args, settings, split)  # no socket, no HTTP: follow rank 0
    idle_exit = parse_duration(args.idle_exit, "--idle-exit") if args.idle_exit else None
    tcp = parse_tcp_address(args.tcp) if args.tcp else None
    api_key = _tcp_api_key(args, tcp)
    # Each budget is read here, so a bad size is said before the runtime process starts.
    cache_bytes = conversation_cache_bytes_from(args.conversation_cache, settings)
    prefix_bytes = prefix_cache_bytes_from(args.prefix_cache, settings)
    history = history_settings_from(args.history_index, settings)
    if args.socket or os.environ.get(SOCKET_ENV, "").strip():
        socket_path = Path(args.socket).expanduser().absolute() if args.socket else None
        socket_path = socket_path or default_socket_path()
        prepare_socket_dir(socket_path, private=False)
    else:
        socket_path = default_socket_path()
        prepare_socket_dir(socket_path, private=True)
    # Refuse before the slow part: loading a model only to find the place taken.
    _refuse_if_taken(socket_path)
    ensure_not_running(socket_path)

    from app.engine.runtime_wire import RuntimeSpec

    runtime = choose_runtime(args.runtime)
    # The socket is ours now: record what we do, and a fatal signal, for the clients.
    crash_record.start_recording(socket_path, runtime)
    pairs = CatalogPairs(runtime)
    defaults = LoadOptions(
        context_length=args.context or settings.context_length,
        exact=settings.exact_output,
        parallel=parallel,
        workers=workers,
    )
    scheduler: PairScheduler | None = None
    spec: RuntimeSpec | None = None
    preload: Callable[[], None] | None = None
    if split is not None:  # rank 0: no caches, no unload, no other pair (mlx_split.py)
        # One process: the other ranks follow this one's calls on its target.
        if runtime == "llamacpp":
            watch_llamacpp(worker_timeout)
        loader, scheduler = split_scheduler(runtime, defaults, split)
        keep_alive = None
        preload = _preloader(args.pair, loader, defaults, scheduler) if args.pair else None
    else:
        # The runtime in a process of its own, which the front starts and watches.
        spec = RuntimeSpec(
            build=build_catalog_runtime,
            defaults=defaults,
            keep_alive=keep_alive,
            runtime=runtime,
            setup=CatalogRuntime(
                runtime=runtime,
                conversation_cache_bytes=cache_bytes,
                prefix_cache_bytes=prefix_bytes,
                history=history,
                worker_timeout=worker_timeout,
            ),
            # The runtime process is spawned: it knows serve's --target/--draft pair
            # only from here.
            command_line_pairs=command_line_pairs(),
            preload=(args.pair, defaults) if args.pair else None,
            record_path=runtime_record_path(socket_path),
            log_path=Path(args.log_file).expanduser().absolute() if args.log_file else None,
        )

    # SIGTERM (systemd, launchd, kill) means "stop cleanly": while serving, uvicorn
    # handles it; before that, this flag stops the server as soon as it starts.
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    server: AgentServer | None = None
    try:
        server = AgentServer(
            socket_path=socket_path,
            settings=settings,
            scheduler=scheduler,
            runtime=spec,
            pairs=pairs,
            queue_limit=args.queue,
            tcp=tcp,
            stop=stop,
            idle_exit=idle_exit,
            api_key=api_key.value if api_key else None,
            tcp_without_key=args.no_api_key,
            preload=preload,
        )
        if not stop.is_set():
            show_key = sys.stderr.isatty() and not args.log_file
            server.run(announce=_announce(args.pair, keep_alive, idle_exit, api_key, show_key))
    finally:
        signal.signal(signal.SIGTERM, previous)
        # A generation stuck in one long call still uses the models: leave them to the
        # process exit rather than free them under it.
        if scheduler is not None and (server is None or server.worker_stopped):
            scheduler.unload("the engine stopped")
        crash_record.stop_recording()
    return 0


def _preloader(
    pair: str, loader: PairLoader, options: LoadOptions, scheduler: PairScheduler
) -> Callable[[], None]:
    """``serve --pair``: load the pair and hand it to the scheduler (run on the worker)."""

    def preload() -> None:
        scheduler.adopt(pair, loader(pair, options, _progress), options)

    return preload


def _tcp_api_key(args: argparse.Namespace, tcp: tuple[str, int] | None) -> ApiKey | None:
    """The key TCP clients must send; None without TCP, or with ``--no-api-key``."""
    from app.client.api_key import engine_api_key

    if args.api_key is not None and args.no_api_key:
        raise DraftpenError("--api-key and --no-api-key contradict each other; pick one.")
    if tcp is None:
        if args.api_key is not None or args.no_api_key:
            raise DraftpenError(
                "--api-key and --no-api-key go with --tcp: the Unix socket needs no key "
                "(only this user can reach it)."
            )
        return None
    if args.no_api_key:
        return None
    return engine_api_key(args.api_key)


def _refuse_if_taken(socket_path: Path) -> None:
    """Say who holds the socket: an engine (which one), or another program."""
    from app.client import EngineError, find_engine
    from app.errors import ServeError, ServerAlreadyRunningError

    try:
        running = find_engine(socket_path)
    except EngineError as error:
        raise ServeError(str(error)) from error
    if running is not None:
        raise ServerAlreadyRunningError(str(socket_path))


def _progress(message: str) -> None:
    print(f"draftpen serve: {message}", file=sys.stderr, flush=True)


def _duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return "at once" if seconds == 0 else f"after {seconds:g}s idle"


def _announce(
    pair: str | None,
    keep_alive: float | None,
    idle_exit: float | None,
    api_key: ApiKey | None = None,
    show_key: bool = False,
) -> Callable[[str], None]:
    def announce(address: str) -> None:
        if address.startswith("unix:"):
            # The one line on stdout: scripts and tests wait for it.
            print(f"draftpen serve: listening on {address}", flush=True)
            path = address.removeprefix("unix:")
            held = f"'{pair}' loaded" if pair else "no pair loaded yet"
            _progress(
                f"{held}; a request naming a downloaded pair loads it; unloads "
                f"{_duration_text(keep_alive)}; "
                + (
                    f"stops after {idle_exit:g}s with no work and no front end attached"
                    if idle_exit is not None
                    else "runs until stopped"
                )
            )
            _progress(f"try: curl --unix-socket {path} http://draftpen/v1/models")
        elif api_key is None:
            _progress(
                f"WARNING: also listening on {address}/v1 with no API key (--no-api-key) "
                "and no peer check: any process that can reach this address can use the model"
            )
        else:
            _progress(
                f"also listening on {address}/v1; every request there must carry the API "
                "key, as 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
            )
            # The key itself only to a person at a terminal, never into a log file.
            where = f"kept in {api_key.source}" if "/" in api_key.source else api_key.source
            made = ", made just now" if api_key.created else ""
            shown = f"{api_key.value} ({where}{made})" if show_key else f"{where}{made}"
            _progress(f"API key: {shown}")

    return announce
