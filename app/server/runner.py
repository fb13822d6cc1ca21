"""Running the agent server: uvicorn on the sockets, a clean stop, the socket removed."""

from __future__ import annotations

import copy
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
import uvicorn.config

from app.server.api import MAX_BODY_BYTES, AgentApi
from app.server.queue import (
    DEFAULT_QUEUE_LIMIT,
    GenerationQueue,
)
from app.server.unix_socket import (
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


def _log_config() -> dict[str, Any]:
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    # stdout carries only the "listening on" line that scripts wait for; logs go to stderr.
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    config["loggers"]["draftpen"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


class _UvicornServer(uvicorn.Server):
    """uvicorn's server, stopping the generations before it waits for open responses."""

    def __init__(
        self, config: uvicorn.Config, queue: GenerationQueue, stop: threading.Event
    ) -> None:
        super().__init__(config)
        self._queue = queue
        self._stop = stop

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        # A SIGTERM that came before uvicorn installed its own handlers.
        if self._stop.is_set():
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn waits for every open response to finish; cancelling the generations
        # makes streams end at the next round (finish_reason "cancelled").
        self._queue.shutdown()
        await super().shutdown(sockets=sockets)


class AgentServer:
    """One engine served on a Unix socket (and on TCP only when ``tcp`` is given).

    :meth:`run` blocks until the server is stopped (SIGTERM/SIGINT, or :meth:`stop`
    from another thread), then cancels what is in flight and removes its socket. The
    caller keeps ownership of the engine. ``allowed_uid`` is the one user served over
    the Unix socket (default: this process's); ``stop``, when already set at startup
    (a SIGTERM during model loading), makes the server stop at once.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        model_id: str,
        socket_path: Path,
        settings: Settings,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
        tcp: tuple[str, int] | None = None,
        allowed_uid: int | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        stop: threading.Event | None = None,
        configure_logging: bool = True,
    ) -> None:
        self.engine = engine
        self.socket_path = socket_path
        self.tcp = tcp
        self.queue = GenerationQueue(engine, max_waiting=queue_limit)
        self.api = AgentApi(
            engine,
            self.queue,
            model_id=model_id,
            settings=settings,
            max_body_bytes=max_body_bytes,
        )
        self._stop = stop or threading.Event()
        uid = os.getuid() if allowed_uid is None else allowed_uid
        config = uvicorn.Config(
            self.api.app(),
            http=peer_checked_protocol(uid),
            ws="none",
            lifespan="off",
            # uvicorn's console logging, plus draftpen's own lines; an embedding
            # program (a test) keeps its own logging instead.
            log_config=_log_config() if configure_logging else None,
            timeout_graceful_shutdown=int(_WORKER_STOP_SECONDS),
        )
        self._server = _UvicornServer(config, self.queue, self._stop)
        self.worker_stopped = True

    def run(self, announce: Callable[[str], None] | None = None) -> None:
        """Listen, serve until stopped, then clean up; ``announce`` gets each address."""
        listener = bind_unix_socket(self.socket_path)
        info = self.socket_path.stat()
        identity = (info.st_dev, info.st_ino)
        sockets = [listener]
        self.queue.start()
        self.worker_stopped = False
        try:
            if self.tcp is not None:
                sockets.append(bind_tcp_socket(*self.tcp))
            if announce is not None:
                announce(f"unix:{self.socket_path}")
                if self.tcp is not None:
                    announce(f"http://{self.tcp[0]}:{self.tcp[1]}")
            self._server.run(sockets=sockets)
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
