"""A reply as it streams in from the engine: the worker thread's side of writing one.

:func:`stream_reply` runs in a thread worker. It reads the engine's stream
(:meth:`EngineClient.chat`), splits a thinking model's reasoning from its answer (off
the UI thread), gathers the events into a :class:`ReplyInProgress` under its lock, and
posts only the reply's start, its notices (waiting in the engine's queue, the engine
loading) and its end, as the messages below; the screen that shows the reply
(``screens/reply_writing.py``) handles them and draws the rest on a timer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from textual.message import Message

from app.client import (
    CancelFlag,
    ChatTurn,
    EngineClient,
    EngineCrashedError,
    EngineLost,
    EngineRuntimeRestartedError,
    Loading,
    Waiting,
)
from app.errors import DraftpenError
from app.tui.reply import merge_segments
from app.tui.widgets.message_view import MessageView
from backends.generation_events import GenerationEvent
from backends.output.reasoning import ReasoningSplit, ReasoningSplitter


@dataclass
class ReplyInProgress:
    """The reply being written: where it is shown and stored, and what it has so far.

    The worker thread adds to ``segments``, ``content`` and ``last_event`` under
    ``lock``; the UI thread reads them under it (:meth:`snapshot`).
    """

    message_id: int
    chat_id: int
    view: MessageView
    cancel: CancelFlag = field(default_factory=CancelFlag)
    lock: threading.Lock = field(default_factory=threading.Lock)
    segments: list[tuple[str, bool]] = field(default_factory=list)
    content: str = ""
    # A thinking model's reasoning so far, kept apart from the answer in ``content``.
    reasoning: str = ""
    reasoning_tokens: int = 0
    last_event: GenerationEvent | None = None
    # What the reply waits for before its first token (the queue, a load), or "".
    notice: str = ""
    last_saved: float = 0.0
    # Drawn whole (finished, stopped or failed): no redraw may follow (UI thread).
    ended: bool = False
    # Other requests the engine writes at the same time (an agent beside the chat),
    # as its /health said a moment ago (engine_watch).
    others_writing: int = 0

    def add(self, event: GenerationEvent, split: ReasoningSplit | None = None) -> None:
        """Take in one event of the loop (worker thread); ``split``: its reasoning apart."""
        with self.lock:
            if split is None:
                merge_segments(self.segments, event.segments)
                self.content += event.text
            else:
                merge_segments(self.segments, split.answer)
                self.content += split.answer_text
                self.reasoning += split.reasoning_text
                self.reasoning_tokens += split.reasoning_tokens
            self.last_event = event

    def snapshot(self) -> tuple[list[tuple[str, bool]], str, GenerationEvent | None]:
        """The segments (a copy), text and latest event as of now (UI thread)."""
        with self.lock:
            return list(self.segments), self.content, self.last_event

    def reasoning_so_far(self) -> tuple[str, int]:
        """The reasoning text and its token count as of now (UI thread)."""
        with self.lock:
            return self.reasoning, self.reasoning_tokens


@dataclass
class ReplyStarted(Message):
    """The first event of ``message_id`` arrived: replace "Ready" with live figures."""

    message_id: int


@dataclass
class ReplyNotice(Message):
    """The reply waits: ``text`` says for what (the engine's queue, a load)."""

    message_id: int
    text: str


@dataclass
class ContextFitted(Message):
    """The engine left out the ``left_out`` oldest messages so the chat fits its context."""

    message_id: int
    left_out: int


@dataclass
class ReplyLost(Message):
    """The engine went away while writing ``message_id``; ``error`` says so.

    ``crashed``: its runtime crashed (a fatal signal); ``gives_up``: it has crashed
    twice, and is not started again. ``runtime_restarted``: only the engine's runtime
    process died, and the engine starts it again itself (the engine is still there).
    """

    message_id: int
    error: str
    crashed: bool = False
    gives_up: bool = False
    runtime_restarted: bool = False


@dataclass
class ReplyFinished(Message):
    """The reply stored as ``message_id`` ended; its last event has the figures."""

    message_id: int


@dataclass
class ReplyFailed(Message):
    """Generation for ``message_id`` failed; ``error`` is the message for the user."""

    message_id: int
    error: str


def stream_reply(
    client: EngineClient,
    turn: ChatTurn,
    reply: ReplyInProgress,
    post: Callable[[Message], object],
) -> None:
    """Stream the reply from the engine, gathering it into ``reply`` (runs in a thread)."""
    try:
        stream = client.chat(turn, reply.cancel)
        splitter: ReasoningSplitter | None = None
        generated = 0
        for item in stream:
            if isinstance(item, Waiting):
                post(ReplyNotice(reply.message_id, waiting_text(item)))
            elif isinstance(item, Loading):
                text = f"The engine is loading {turn.pair}: {item.text}…"
                post(ReplyNotice(reply.message_id, text))
            else:
                first = reply.last_event is None
                if first and stream.reasoning is not None:  # known with the first event
                    splitter = ReasoningSplitter(stream.reasoning)
                if first and stream.left_out_messages:  # known with the first event too
                    left_out = stream.left_out_messages
                    post(ContextFitted(reply.message_id, left_out))
                # Events rebuilt from the stream carry no token ids: the running
                # count says how many tokens this one brought.
                tokens = item.stats.generated_tokens - generated
                generated = item.stats.generated_tokens
                split = None
                if splitter is not None:  # split here, off the UI thread
                    split = splitter.feed(item.segments, tokens)
                    if item.finish_reason is not None:
                        split = split + splitter.finish()
                reply.add(item, split)
                if first:
                    post(ReplyStarted(reply.message_id))
        post(ReplyFinished(reply.message_id))
    except EngineRuntimeRestartedError as error:
        # The engine stays; its runtime starts again by itself: nothing to restart here.
        post(ReplyLost(reply.message_id, str(error), runtime_restarted=True))
    except EngineCrashedError as error:
        post(ReplyLost(reply.message_id, str(error), crashed=True, gives_up=error.gives_up))
    except EngineLost as error:
        post(ReplyLost(reply.message_id, str(error)))
    except (DraftpenError, ValueError) as error:
        post(ReplyFailed(reply.message_id, str(error)))
    except Exception as error:  # a bug: say so, and keep what was written
        post(ReplyFailed(reply.message_id, f"unexpected {type(error).__name__}: {error}"))


def waiting_text(waiting: Waiting) -> str:
    """What the stats bar says while the reply waits in the engine's queue."""
    ahead = ", ".join(waiting.ahead) if waiting.ahead else "other requests"
    return f"Waiting for the engine: {waiting.position} ahead ({ahead})…"
