"""Showing a reply while it is written: the UI thread's side of writing one.

:class:`ReplyWritingScreen` is what the chat screen builds on: it starts the worker
that streams the reply (``app.tui.streaming``), and while a reply is written it wakes a
few times a second to draw what arrived and the live figures. Everything that touches
widgets or the history database happens here, on the UI thread. The reply is saved as
it grows (at most half a second behind), so a crash keeps it; when it ends it is
finished or stopped (Esc), and if the engine dies mid-reply, what it wrote is saved as
interrupted and the engine restarted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from textual import on, work
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.timer import Timer

from app.chats.history import COMPLETE, FAILED, INTERRUPTED, STOPPED, History
from app.client import ChatTurn, EngineClient
from app.errors import HistoryError
from app.rates import RollingRate
from app.settings import Settings
from app.tui.priority import LowerPriority
from app.tui.reply import ReplyFigures
from app.tui.streaming import (
    ContextFitted,
    ReplyFailed,
    ReplyFinished,
    ReplyInProgress,
    ReplyLost,
    ReplyNotice,
    ReplyStarted,
    stream_reply,
)
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.stats_bar import StatsBar
from backends.generation_events import FINISH_CANCELLED, GenerationEvent


class ChatHost(Protocol):
    """What the chat screen needs of the app that shows it (the app implements it).

    Declared here, not imported from ``app.tui.app``, so the app imports the screen
    and never the other way round.
    """

    history: History
    settings: Settings
    pair_name: str
    client: EngineClient | None
    engine_status: str

    @property
    def ready(self) -> bool:
        """Whether the engine holds the pair, so a message can be sent."""
        ...

    def load_pair(self, pair_name: str) -> None:
        """Load ``pair_name`` behind the UI, replacing the current pair."""
        ...

    def restart_engine(self, reason: str) -> None:
        """Say ``reason``, start a new engine and load the pair again."""
        ...


SAVE_INTERVAL_SECONDS = 0.5
# The reply's text and the stats bar are redrawn together, on one timer that runs only
# while a reply is written: every redraw renders the screen on the UI thread, which
# takes CPU that decoding needs.
REFRESH_SECONDS = 0.5
# How often the engine is asked, while a reply is written, what else it writes.
ENGINE_WATCH_SECONDS = 2.0


class ReplyWritingScreen(Screen[None]):
    """A screen that shows a reply as it is written, into a ``#conversation`` it composes.

    The subclass composes the conversation, the ``PromptInput`` and the ``StatsBar``,
    and calls :meth:`_start_reply`; everything from there to the reply's end is here.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reply: ReplyInProgress | None = None
        self.rolling_rate = RollingRate()
        self._refresh_timer: Timer | None = None
        # One redraw of the reply at a time: the timer's ticks run beside the message
        # handlers, and each awaits (mounting Markdown blocks) part-way through.
        self._drawing = asyncio.Lock()
        # The model runs in the engine's process: all of this one may yield to it.
        self.priority = LowerPriority(whole_process=True)

    @property
    def draftpen(self) -> ChatHost:
        """The app, as the host this screen relies on."""
        return self.app  # type: ignore[return-value]

    def _start_reply(self, client: EngineClient, turn: ChatTurn, reply: ReplyInProgress) -> None:
        """Write ``reply`` (its message and view are in place): stream it, draw it on a timer."""
        self.reply = reply
        self.rolling_rate.reset()
        self.rolling_rate.add(0)
        self._write_reply(client, turn, self.reply)
        self._watch_engine(client, self.reply)
        self._refresh_timer = self.set_interval(REFRESH_SECONDS, self._refresh_reply)
        # A blinking cursor repaints the prompt twice a second: steady while writing.
        self.query_one(PromptInput).cursor_blink = False
        self.priority.lower()

    @work(thread=True, exclusive=True, group="engine-watch", exit_on_error=False)
    def _watch_engine(self, client: EngineClient, reply: ReplyInProgress) -> None:
        """While ``reply`` is written, how many other requests the engine writes beside
        it (an agent working on the same engine), for the stats line."""
        while not reply.ended and not reply.cancel.is_set():
            try:
                running = client.health().queue.running_count
            except Exception:  # the stream's own handling says what went wrong
                return
            reply.others_writing = max(0, running - 1)
            time.sleep(ENGINE_WATCH_SECONDS)

    @work(thread=True, exclusive=True, group="reply", exit_on_error=False)
    def _write_reply(self, client: EngineClient, turn: ChatTurn, reply: ReplyInProgress) -> None:
        """Stream the reply from the engine, gathering it into ``reply`` (runs in a thread)."""
        stream_reply(client, turn, reply, self.post_message)

    @on(ReplyNotice)
    def _reply_notice(self, message: ReplyNotice) -> None:
        reply = self.reply
        if reply is None or reply.message_id != message.message_id:
            return
        reply.notice = message.text
        if reply.last_event is None:
            self.query_one(StatsBar).show_status(message.text)

    @on(ContextFitted)
    def _context_fitted(self, message: ContextFitted) -> None:
        noun = "message was" if message.left_out == 1 else "messages were"
        self.notify(
            f"The {message.left_out} oldest {noun} left out so the chat fits the model's "
            "context: the model does not see them (the chat keeps them). Ctrl+N starts a "
            "new chat.",
            title="The chat is longer than the context",
            severity="warning",
            timeout=10,
        )

    async def _keep_unfinished(
        self, reply: ReplyInProgress, state: str, note: str | None = None
    ) -> None:
        """Save and show what a reply that did not finish wrote, marked ``state``."""
        async with self._drawing:
            reply.ended = True
            segments, content, _ = reply.snapshot()
            with self._saving():
                self.draftpen.history.update_message(
                    reply.message_id,
                    content=content,
                    segments=segments,
                    state=state,
                    reasoning=reply.reasoning_so_far()[0],
                )
            if reply.view.is_attached:
                await reply.view.append(segments, content, complete=True)
                reply.view.finish(None, state, note=note)

    @on(ReplyLost)
    async def _reply_lost(self, message: ReplyLost) -> None:
        reply = self.reply
        if reply is None or reply.message_id != message.message_id:
            return
        if message.runtime_restarted:
            what = "the engine's runtime restarted"
        elif message.crashed:
            what = "the runtime crashed"
        else:
            what = "the engine stopped"
        await self._keep_unfinished(reply, INTERRUPTED, note=f"interrupted: {what}")
        self.notify(
            f"{message.error} What it wrote is kept; the chat is intact.",
            title=f"{what[0].upper()}{what[1:]} mid-reply",
            severity="error",
            timeout=30 if message.crashed or message.runtime_restarted else 15,
        )
        self._reply_ended()
        if message.runtime_restarted:
            return  # the engine is there, and starts its runtime again by itself
        if message.gives_up:  # one restart was tried already: no crash loop
            self.draftpen.give_up_on_engine(message.error)
        else:
            self.draftpen.restart_engine(f"{what.capitalize()} mid-reply.")

    @on(ReplyStarted)
    async def _reply_started(self, message: ReplyStarted) -> None:
        if self.reply is not None and self.reply.message_id == message.message_id:
            await self._refresh_reply()

    @on(ReplyFinished)
    async def _reply_finished(self, message: ReplyFinished) -> None:
        reply = self.reply
        if reply is None or reply.message_id != message.message_id:
            return
        segments, content, event = await self._draw_reply(reply, complete=True)
        self._finish_reply(reply, segments, content, event)

    async def _draw_reply(
        self, reply: ReplyInProgress, *, complete: bool = False
    ) -> tuple[list[tuple[str, bool]], str, GenerationEvent | None]:
        """Show what ``reply`` has received so far; returns that snapshot.

        ``complete``: the reply ended, render all of it. The snapshot is taken under
        the drawing lock, so an older one is never drawn over a newer one.
        """
        async with self._drawing:
            segments, content, event = reply.snapshot()
            if not reply.ended:
                reply.ended = complete
                await self._show_reply_text(reply, segments, content, complete=complete)
        return segments, content, event

    async def _show_reply_text(
        self,
        reply: ReplyInProgress,
        segments: list[tuple[str, bool]],
        content: str,
        *,
        complete: bool = False,
    ) -> None:
        """Bring the reply's view up to date with the text received so far.

        The conversation follows the reply unless the person scrolled away from its
        end; it scrolls only when the reply's shape changed, since a scroll repaints all.
        """
        if not reply.view.is_attached:
            return
        reasoning, reasoning_tokens = reply.reasoning_so_far()
        reasoning_changed = reply.view.reasoning != reasoning
        text_changed = reply.view.content != content or complete
        if not text_changed and not reasoning_changed:
            return
        conversation = self.query_one("#conversation", VerticalScroll)
        following = conversation.is_vertical_scroll_end
        if reasoning_changed:
            # Above the answer; it collapses when the answer's first text arrives.
            await reply.view.show_reasoning(
                reasoning, answered=bool(content), tokens=reasoning_tokens
            )
        reshaped = text_changed and await reply.view.append(segments, content, complete=complete)
        if following and (reshaped or reasoning_changed):
            conversation.scroll_end(animate=False)

    def _finish_reply(
        self,
        reply: ReplyInProgress,
        segments: list[tuple[str, bool]],
        content: str,
        event: GenerationEvent | None,
    ) -> None:
        # Esc closes the stream, so a stopped reply ends on its last event before the
        # finish (or on none, stopped while it waited in the queue).
        stopped = reply.cancel.is_set() and (event is None or event.finish_reason is None)
        reasoning_tokens = reply.reasoning_so_far()[1]
        figures = ReplyFigures.from_event(event, reasoning_tokens) if event is not None else None
        if stopped and figures is not None:
            figures = dataclasses.replace(figures, finish_reason=FINISH_CANCELLED)
        finish = figures.finish_reason if figures is not None else FINISH_CANCELLED
        state = STOPPED if finish == FINISH_CANCELLED else COMPLETE
        stats = None
        if figures is not None and event is not None:
            stats = {**figures.as_dict(), "loop": event.stats.as_dict()}
        with self._saving():
            self.draftpen.history.update_message(
                reply.message_id,
                content=content,
                segments=segments,
                state=state,
                stats=stats,
                reasoning=reply.reasoning_so_far()[0],
            )
        if reply.view.is_attached:
            reply.view.finish(figures, state)
        if figures is not None:
            self.query_one(StatsBar).show_final(figures)
        else:
            self.query_one(StatsBar).show_status("Stopped before the first token.")
        self._reply_ended()

    def _reply_ended(self) -> None:
        self.reply = None
        if self._refresh_timer is not None:
            self._refresh_timer.stop()
            self._refresh_timer = None
        self.query_one(PromptInput).cursor_blink = True
        self.priority.restore()

    @on(ReplyFailed)
    async def _reply_failed(self, message: ReplyFailed) -> None:
        reply = self.reply
        if reply is None or reply.message_id != message.message_id:
            return
        await self._keep_unfinished(reply, FAILED)
        self.query_one(StatsBar).show_status(f"error: {message.error}")
        self.notify(message.error, title="Generation failed", severity="error", timeout=10)
        self._reply_ended()

    @contextmanager
    def _saving(self) -> Iterator[None]:
        """Report a history write that failed (a full disk); the screen keeps the text."""
        try:
            yield
        except HistoryError as error:
            self.notify(str(error), title="Not saved", severity="error", timeout=15)

    def action_stop(self) -> None:
        """Stop the reply now; what was shown stays.

        The reply ends here at once; the client hangs up its stream at once too, and
        the engine, told by the closed connection, stops at the end of its round.
        """
        if self.reply is not None and not self.reply.cancel.is_set():
            self.reply.cancel.set()
            self.post_message(ReplyFinished(self.reply.message_id))

    def _stop_for(self, purpose: str) -> None:
        if self.reply is not None and not self.reply.cancel.is_set():
            self.action_stop()
            self.notify(f"Stopped the reply to {purpose}; what it wrote is kept.")

    async def _refresh_reply(self) -> None:
        """The timer's tick: the reply's new text, the live figures, and a save."""
        reply = self.reply
        if reply is None:
            return
        segments, content, event = await self._draw_reply(reply)
        if event is None or reply.ended:
            return
        self.rolling_rate.add(event.stats.generated_tokens)
        figures = ReplyFigures.from_event(event, reply.reasoning_so_far()[1])
        self.query_one(StatsBar).show_live(figures, self.rolling_rate.rate(), reply.others_writing)
        if time.monotonic() - reply.last_saved >= SAVE_INTERVAL_SECONDS:
            with self._saving():
                self.draftpen.history.update_message(
                    reply.message_id,
                    content=content,
                    segments=segments,
                    reasoning=reply.reasoning_so_far()[0],
                )
            reply.last_saved = time.monotonic()
