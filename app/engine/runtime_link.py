"""One runtime process and the front's end of its pipe: started, written to, read from.

:class:`RuntimeLink` starts ``runtime_child.run_runtime`` with multiprocessing's
``spawn`` (never a fork of a process that runs threads: the front runs uvicorn's and
the supervisor's), writes the front's messages to it, and reads what it sends on a
thread of its own, handing each message to ``receive``; when the pipe closes (the
runtime stopped, or died) it reaps the process and calls ``ended`` once.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import threading
from collections.abc import Callable

from app.engine.runtime_child import run_runtime
from app.engine.runtime_wire import RuntimeSpec

logger = logging.getLogger("draftpen.server")

# How long a stop waits for the runtime to exit after it was killed.
_REAP_SECONDS = 5.0


class RuntimeLink:
    """A started runtime process (``pid``), and whether it said it is ready."""

    def __init__(
        self,
        spec: RuntimeSpec,
        receive: Callable[[RuntimeLink, object], None],
        ended: Callable[[RuntimeLink], None],
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, runtime_end = context.Pipe()
        self.process = context.Process(
            target=run_runtime, args=(runtime_end, spec), name="draftpen-runtime", daemon=True
        )
        self._receive = receive
        self._ended = ended
        self.ready = threading.Event()
        self.preload_error: str | None = None
        self.process.start()
        runtime_end.close()  # the child's end lives in the child: EOF when it is gone
        self.pid: int = self.process.pid or 0
        logger.info("started the engine's runtime process (pid %s)", self.pid)
        self._reader = threading.Thread(target=self._read, name="draftpen-runtime-in", daemon=True)
        self._reader.start()

    @property
    def exitcode(self) -> int | None:
        """How the process ended (negative: the signal), once it has."""
        return self.process.exitcode

    def send(self, message: object) -> None:
        """Write ``message`` (callers serialise their writes); a dead pipe is left to the
        reader, which sees it close."""
        try:
            self._connection.send(message)
        except (OSError, ValueError, pickle.PicklingError) as error:
            logger.warning("could not send %s to the runtime: %s", type(message).__name__, error)

    def join(self, timeout: float) -> bool:
        """Wait ``timeout`` seconds for the process to exit; kill it if it has not
        (it is ours). False if it had to be killed."""
        self.process.join(timeout)
        if not self.process.is_alive():
            return True
        self.process.kill()
        self.process.join(_REAP_SECONDS)
        return False

    def _read(self) -> None:
        """Hand on each message the runtime sends, until its pipe closes."""
        while True:
            try:
                batch = pickle.loads(self._connection.recv_bytes())
            except (EOFError, OSError):
                break
            except Exception as error:  # a message that does not unpickle: a bug
                logger.warning("unreadable message from the runtime: %r", error)
                continue
            for message in batch:
                self._receive(self, message)
        self.process.join()
        self._connection.close()
        self._ended(self)
