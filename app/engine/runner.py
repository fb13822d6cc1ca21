"""Running the engine: uvicorn on the sockets, idle exit, a clean stop, the socket removed."""

from __future__ import annotations

import copy
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
import uvicorn.config

from app.engine.api import AgentApi
from app.engine.api_key_check import ApiKeyCheck
from app.engine.engine_parts import HeldPairs, JobQueue
from app.engine.pairs import FixedPairs, PairDirectory
from app.engine.queue import (
    DEFAULT_QUEUE_LIMIT,
    GenerationQueue,
)
from app.engine.request_body import MAX_BODY_BYTES
from app.engine.runtime_deaths import CrashWindow
from app.engine.runtime_supervisor import RuntimeSupervisor
from app.engine.runtime_wire import RuntimeSpec
from app.engine.scheduler import LoadOptions, PairScheduler
from app.engine.unix_socket import (
    bind_tcp_socket,
    bind_unix_socket,
    peer_checked_protocol,
    remove_socket_if_ours,
)
from app.settings import Settings
from backends.engine import Engine

logger = logging.getLogger("draftpen.server")

# How long shutdown waits for the generation in progress to reach its next round.
_WORKER_STOP_SECONDS = 30.0
# How often an engine with --idle-exit looks whether it is idle.
_IDLE_CHECK_SECONDS = 0.2


def _log_config() -> dict[str, Any]:
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    # stdout carries only the "listening on" line that scripts wait for; logs go to stderr.
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    config["loggers"]["draftpen"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


class _UvicornServer(uvicorn.Server):
    """uvicorn's server, stopping the generations before it waits for open responses."""

    def __init__(
        self, config: uvicorn.Config, api: AgentApi, queue: JobQueue, stop: threading.Event
    ) -> None:
        super().__init__(config)
        self._api = api
        self._queue = queue
        self._stop = stop

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        # A SIGTERM that came before uvicorn installed its own handlers.
        if self._stop.is_set():
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn waits for every open response to finish; cancelling the generations
        # makes streams end at the next round (finish_reason "cancelled"); attached
        # front ends' connections end too.
        self._queue.shutdown()
        self._api.close_attachments()
        await super().shutdown(sockets=sockets)


class AgentServer:
    """The engine served on a Unix socket (and on TCP only when ``tcp`` is given).

    Pairs come from ``pairs`` and are loaded when a request names one: by a runtime
    process that ``runtime`` says how to start (``draftpen serve``: the front supervises
    it, ``runtime_supervisor``), or by ``scheduler`` in this process; or, for tests and
    embedding programs, ``engine`` is the one pair served, as ``model_id``, and the
    caller keeps ownership of it. :meth:`run` blocks until the
    server is stopped (SIGTERM/SIGINT, :meth:`stop` from another thread, or
    ``idle_exit`` seconds with no work and no attached client), then cancels what is in
    flight and removes its socket. ``allowed_uid`` is the one user served over the Unix
    socket (default: this process's); ``stop``, when already set at startup (a SIGTERM
    during model loading), makes the server stop at once.

    ``runtime_crashes`` counts the runtime process's deaths (default: 3 within 10
    minutes stop its restarts).

    On TCP every request must carry ``api_key`` (``api_key_check``); serving TCP without
    a key needs ``tcp_without_key`` said out loud. Port 0 takes a free port: the one
    taken is announced and reported by ``GET /health`` (``tcp``).
    """

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        model_id: str | None = None,
        socket_path: Path,
        settings: Settings,
        scheduler: PairScheduler | None = None,
        pairs: PairDirectory | None = None,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
        tcp: tuple[str, int] | None = None,
        allowed_uid: int | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        stop: threading.Event | None = None,
        configure_logging: bool = True,
        idle_exit: float | None = None,
        api_key: str | None = None,
        tcp_without_key: bool = False,
        preload: Callable[[], None] | None = None,
        runtime: RuntimeSpec | None = None,
        runtime_crashes: CrashWindow | None = None,
    ) -> None:
        if tcp is not None and not api_key and not tcp_without_key:
            raise ValueError("TCP needs an api_key (or tcp_without_key=True, said out loud)")
        if engine is not None:
            fixed = FixedPairs(model_id or engine.target.name, engine)
            options = LoadOptions(engine.target.n_ctx, settings.exact_output)
            scheduler = PairScheduler(fixed.loader, options)
            scheduler.adopt(fixed.name, engine, options)
            pairs = fixed
        if (scheduler is None and runtime is None) or pairs is None:
            raise ValueError("AgentServer needs an engine, or a scheduler or runtime and pairs")
        # Loads a pair before the socket opens (``serve --pair``), on the worker thread.
        self.preload = preload
        self.socket_path = socket_path
        self.tcp = tcp
        self.idle_exit = idle_exit
        self.queue: JobQueue
        held: HeldPairs
        if runtime is not None:
            supervisor = RuntimeSupervisor(
                runtime, max_waiting=queue_limit, crashes=runtime_crashes
            )
            self.queue = held = supervisor
            self.runtime: RuntimeSupervisor | None = supervisor
        else:
            assert scheduler is not None
            self.queue = GenerationQueue(scheduler, max_waiting=queue_limit)
            held = scheduler
            self.runtime = None
        self.scheduler = held
        self.api = AgentApi(
            held,
            self.queue,
            pairs=pairs,
            settings=settings,
            max_body_bytes=max_body_bytes,
            idle_exit=idle_exit is not None,
            runtime=self.runtime.report if self.runtime is not None else None,
        )
        self._stop = stop or threading.Event()
        uid = os.getuid() if allowed_uid is None else allowed_uid
        app = self.api.app()
        config = uvicorn.Config(
            ApiKeyCheck(app, api_key) if api_key else app,
            http=peer_checked_protocol(uid),
            ws="none",
            lifespan="off",
            # uvicorn's console logging, plus draftpen's own lines; an embedding
            # program (a test) keeps its own logging instead.
            log_config=_log_config() if configure_logging else None,
            timeout_graceful_shutdown=int(_WORKER_STOP_SECONDS),
        )
        self._server = _UvicornServer(config, self.api, self.queue, self._stop)
        self.worker_stopped = True

    def idle_seconds(self) -> float | None:
        """How long nothing has run or waited and no front end was attached; None if busy."""
        state = self.queue.state()
        if state.idle_since is None or self.api.attached > 0:
            return None
        return time.monotonic() - max(state.idle_since, self.api.detached_at)

    def _watch_idle(self, grace: float, done: threading.Event) -> None:
        """Stop the server once it has been idle for ``grace`` seconds (--idle-exit)."""
        while not done.wait(_IDLE_CHECK_SECONDS):
            idle = self.idle_seconds()
            if idle is not None and idle >= grace:
                logger.info("idle for %.0fs with no client attached: stopping (--idle-exit)", idle)
                self.stop()
                return

    def run(self, announce: Callable[[str], None] | None = None) -> None:
        """Load the preload on the worker thread, then listen, serve until stopped, and
        clean up; ``announce`` gets each address."""
        self.worker_stopped = False
        try:
            # A runtime process starts here, its preload loaded before it says ready.
            self.queue.start()
            if self.preload is not None:
                # On the worker thread, as every later generation: one thread computes.
                assert isinstance(self.queue, GenerationQueue)
                self.queue.run_on_worker(self.preload)
            listener = bind_unix_socket(self.socket_path)
        except BaseException:
            self.queue.shutdown("the engine did not start")
            self.worker_stopped = self.queue.join(_WORKER_STOP_SECONDS)
            raise
        info = self.socket_path.stat()
        identity = (info.st_dev, info.st_ino)
        sockets = [listener]
        try:
            if self.tcp is not None:
                tcp_listener = bind_tcp_socket(*self.tcp)
                sockets.append(tcp_listener)
                self.api.tcp_url = _http_url(self.tcp[0], tcp_listener.getsockname()[1])
            if announce is not None:
                announce(f"unix:{self.socket_path}")
                if self.api.tcp_url is not None:
                    announce(self.api.tcp_url)
            watching = threading.Event()
            if self.idle_exit is not None:
                watcher = threading.Thread(
                    target=self._watch_idle,
                    args=(self.idle_exit, watching),
                    name="draftpen-idle-exit",
                    daemon=True,
                )
                watcher.start()
            try:
                self._server.run(sockets=sockets)
            finally:
                watching.set()
        finally:
            self.queue.shutdown()
            self.worker_stopped = self.queue.join(_WORKER_STOP_SECONDS)
            if not self.worker_stopped:
                logger.warning("a generation did not stop in %.0fs", _WORKER_STOP_SECONDS)
            for sock in sockets:
                sock.close()
            remove_socket_if_ours(self.socket_path, identity)

    def stop(self) -> None:
        """Ask a running server to stop (thread-safe: uvicorn polls the flag)."""
        self._stop.set()
        self._server.should_exit = True


def _http_url(host: str, port: int) -> str:
    """``http://HOST:PORT``, an IPv6 host in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
