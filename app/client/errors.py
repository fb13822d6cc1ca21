"""What can go wrong between a front end and the engine, in messages that name the fix."""

from __future__ import annotations

from app.errors import DraftpenError


class EngineError(DraftpenError):
    """A problem reaching or using the engine."""


class EngineLost(EngineError):
    """The engine went away (it died, or was stopped) while a client was using it.

    Whatever was received so far is valid; a front end keeps it, says so, and may start
    the engine again with :func:`~app.client.ensure_engine`.
    """


class EngineCrashedError(EngineLost):
    """The engine died by a fatal signal: the model runtime inside it crashed.

    The message names the signal, what the engine was doing with which pair, and the
    fix (``draftpen doctor``). ``signal_name`` is ``"SIGSEGV"`` and the like; ``doing``
    is ``"loading"``, ``"generating"`` or ``"idle"``; ``pair`` the pair it was using,
    if any. ``gives_up``: this front end has seen the engine crash twice and will not
    start it again (``ensure_engine`` refuses with :class:`EngineCrashLoopError`).
    Like any :class:`EngineLost`, what was received before is valid.
    """

    def __init__(
        self,
        message: str,
        *,
        signal_name: str,
        doing: str | None = None,
        pair: str | None = None,
        gives_up: bool = False,
    ) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.doing = doing
        self.pair = pair
        self.gives_up = gives_up


class NotAnEngineError(EngineError):
    """The socket belongs to something that is not a draftpen engine."""


class EngineVersionError(EngineError):
    """The engine on the socket speaks another version of the API."""


class EngineStartError(EngineError):
    """A client started an engine and it did not come up."""


class EngineCrashLoopError(EngineStartError):
    """The engine crashed twice for this front end, which therefore does not start it again."""


class EngineRequestError(EngineError):
    """The engine refused or failed a request; the message is the engine's own.

    ``status`` is the HTTP status (0 when the error came inside a stream) and ``code``
    the OpenAI-style error code, such as ``model_not_found``.
    """

    def __init__(self, message: str, *, status: int = 0, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


# The engine's error codes for a reply its runtime process did not finish.
RUNTIME_RESTARTED, RUNTIME_STOPPED = "runtime_restarted", "runtime_stopped"


class EngineRuntimeRestartedError(EngineRequestError):
    """The engine's runtime process died mid-reply (an abort in llama.cpp or MLX, a
    worker gone); the engine itself is still there and starts its runtime again.

    The message starts "The engine's runtime restarted:" and says why; what was
    received before is valid, and the next request is answered by the new runtime.
    ``stopped``: it died too often, and the engine does not start it again (the message
    says what to do).
    """

    @property
    def stopped(self) -> bool:
        """Whether the engine stopped starting its runtime."""
        return self.code == RUNTIME_STOPPED
