"""How a front end finds, starts and talks to the engine (``draftpen serve``).

``ensure_engine`` finds the engine on the socket or starts one; :class:`EngineClient`
asks it for its health, its pairs, a load, and streams a chat reply as
:class:`Waiting`, :class:`Loading` and :class:`~backends.generation_events.GenerationEvent`
items (``chat_stream``: the turn asked for, the chunks read back). ``wire`` holds the
request and response shapes the engine uses too; ``engine_log`` the log of an engine a
front end started (``engine.log``, rotated); ``crash_report`` reads the record an engine
whose runtime crashed left beside its socket, and keeps a front end from restarting a
crashing engine more than once.

May import: ``app.settings``, ``app.errors``, ``backends`` (its data types). Never
``app.engine`` (it is reached over the socket) and never a front end: the chat app and
the plain REPL import this package, not the other way round.
"""

from app.client.cancel_flag import CancelFlag
from app.client.chat_stream import ChatTurn, Loading, Waiting
from app.client.engine_client import EngineClient
from app.client.engine_log import engine_log_path
from app.client.errors import (
    EngineCrashedError,
    EngineCrashLoopError,
    EngineError,
    EngineLost,
    EngineRequestError,
    EngineRuntimeRestartedError,
    EngineStartError,
    EngineVersionError,
    NotAnEngineError,
)
from app.client.starting import ensure_engine, find_engine
from app.client.wire import HealthReport as EngineHealth
from app.client.wire import PairCard as PairListing

__all__ = [
    "CancelFlag",
    "ChatTurn",
    "EngineClient",
    "EngineCrashLoopError",
    "EngineCrashedError",
    "EngineError",
    "EngineHealth",
    "EngineLost",
    "EngineRequestError",
    "EngineRuntimeRestartedError",
    "EngineStartError",
    "EngineVersionError",
    "Loading",
    "NotAnEngineError",
    "PairListing",
    "Waiting",
    "engine_log_path",
    "ensure_engine",
    "find_engine",
]
