"""The chat screen: chat list, conversation, prompt and live statistics.

A thread worker streams the reply from the engine (:meth:`EngineClient.chat`) and
gathers its events into the reply (under a lock); the UI thread wakes a few times a
second while a reply is written to draw what arrived, and the worker posts only the
reply's start, notices (waiting in the engine's queue, the engine loading) and its end.
Everything that touches widgets or the history database happens on the UI thread. The
reply is saved as it grows (at most half a second behind), so a crash keeps it; if the
engine dies mid-reply, what it wrote is saved as interrupted and the engine restarted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header

from app.chats.export import chat_to_markdown, export_path, last_code_block
from app.chats.history import (
    COMPLETE,
    FAILED,
    INTERRUPTED,
    STOPPED,
    WRITING,
    History,
    StoredMessage,
)
from app.client import (
    CancelFlag,
    ChatTurn,
    EngineClient,
    EngineCrashedError,
    EngineLost,
    Loading,
    Waiting,
)
from app.errors import DraftpenError, HistoryError
from app.rates import RollingRate
from app.settings import Settings, data_dir
from app.tui.priority import LowerPriority
from app.tui.reply import ReplyFigures, merge_segments
from app.tui.screens.dialogs import ConfirmDialog, RenameDialog
from app.tui.widgets.chat_list import ChatList
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.stats_bar import StatsBar
from backends.base import ChatMessage
from backends.reasoning import ReasoningSplit, ReasoningSplitter
from backends.speculative import FINISH_CANCELLED, GenerationEvent


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


NEW_CHAT_TITLE = "New chat"
SAVE_INTERVAL_SECONDS = 0.5
# The reply's text and the stats bar are redrawn together, on one timer that runs only
# while a reply is written: every redraw renders the screen on the UI thread, which
# takes CPU that decoding needs.
REFRESH_SECONDS = 0.5


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


class ChatScreen(Screen[None]):
    """The main screen."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop writing"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+g", "export", "Export to Markdown"),
        Binding("ctrl+r", "copy_reply", "Copy last reply", show=False),
        Binding("ctrl+b", "copy_code", "Copy last code block"),
        Binding("f2", "rename_chat", "Rename chat", show=False),
        Binding("ctrl+l", "focus_chats", "Chat list", show=False),
    ]
    AUTO_FOCUS = "#prompt"

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
        twice, and is not started again.
        """

        message_id: int
        error: str
        crashed: bool = False
        gives_up: bool = False

    @dataclass
    class ReplyFinished(Message):
        """The reply stored as ``message_id`` ended; its last event has the figures."""

        message_id: int

    @dataclass
    class ReplyFailed(Message):
        """Generation for ``message_id`` failed; ``error`` is the message for the user."""

        message_id: int
        error: str

    def __init__(self) -> None:
        super().__init__()
        self.chat_id: int | None = None
        self.reply: ReplyInProgress | None = None
        self.rolling_rate = RollingRate()
        self.last_export: Path | None = None
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

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield ChatList(id="chats")
            with Vertical(id="main"):
                yield VerticalScroll(id="conversation")
                yield PromptInput(id="prompt")
                yield StatsBar("starting…", id="stats")
        yield Footer()

    async def on_mount(self) -> None:
        chats = self.draftpen.history.chats()
        if chats:
            await self.open_chat(chats[0].id)
        else:
            self.refresh_chat_list()
        # The UI is up; now load the models behind it.
        self.draftpen.load_pair(self.draftpen.pair_name)

    # -- chats ---------------------------------------------------------------------

    def refresh_chat_list(self) -> None:
        """Show the chats, the open one highlighted."""
        self.query_one(ChatList).show_chats(self.draftpen.history.chats(), self.chat_id)

    async def open_chat(self, chat_id: int | None) -> None:
        """Show a chat's messages (None: an empty conversation, created on first send)."""
        self.chat_id = chat_id
        conversation = self.query_one("#conversation", VerticalScroll)
        await conversation.remove_children()
        if chat_id is not None:
            chat = self.draftpen.history.chat(chat_id)
            self.sub_title = chat.title
            views = [_view_for(message) for message in self.draftpen.history.messages(chat_id)]
            await conversation.mount_all(views)
            conversation.scroll_end(animate=False)
        else:
            self.sub_title = NEW_CHAT_TITLE
        self.refresh_chat_list()

    @on(ChatList.Selected)
    async def _chat_selected(self, event: ChatList.Selected) -> None:
        chat = getattr(event.item, "chat", None)
        if chat is None or chat.id == self.chat_id:
            return
        self._stop_for("switch chats")
        await self.open_chat(chat.id)

    @on(ChatList.RenameRequested)
    def _rename_requested(self, event: ChatList.RenameRequested) -> None:
        def rename(title: str | None) -> None:
            if title:
                with self._saving():
                    self.draftpen.history.rename_chat(event.chat.id, title)
                if event.chat.id == self.chat_id:
                    self.sub_title = title
                self.refresh_chat_list()

        self.app.push_screen(RenameDialog(event.chat.title), rename)

    @on(ChatList.DeleteRequested)
    def _delete_requested(self, event: ChatList.DeleteRequested) -> None:
        async def delete(confirmed: bool | None) -> None:
            if not confirmed:
                return
            if self.reply is not None and self.reply.chat_id == event.chat.id:
                self.notify("Stop the reply (Esc) before deleting its chat.", severity="warning")
                return
            try:
                self.draftpen.history.delete_chat(event.chat.id)
            except HistoryError as error:
                self.notify(str(error), title="Not deleted", severity="error", timeout=15)
                return
            self.notify(f"Deleted chat {event.chat.title!r}.")
            if event.chat.id == self.chat_id:
                await self.open_chat(None)
            else:
                self.refresh_chat_list()

        self.app.push_screen(ConfirmDialog(f"Delete chat {event.chat.title!r}?"), delete)

    async def action_new_chat(self) -> None:
        """Start a new, empty chat."""
        self._stop_for("start a new chat")
        await self.open_chat(None)
        self.query_one(PromptInput).focus()

    def action_focus_chats(self) -> None:
        """Move the focus to the chat list."""
        self.query_one(ChatList).focus()

    def action_rename_chat(self) -> None:
        """Rename the open chat (from the command palette)."""
        if self.chat_id is not None:
            self.post_message(ChatList.RenameRequested(self.draftpen.history.chat(self.chat_id)))

    def delete_current_chat(self) -> None:
        """Delete the open chat, after confirmation (from the command palette)."""
        if self.chat_id is not None:
            self.post_message(ChatList.DeleteRequested(self.draftpen.history.chat(self.chat_id)))

    # -- sending and writing ---------------------------------------------------------

    @on(PromptInput.Submitted)
    async def _send(self, event: PromptInput.Submitted) -> None:
        client = self.draftpen.client
        if self.reply is not None:
            self.notify("Still writing: press Esc to stop first.", severity="warning")
            return
        if client is None or not self.draftpen.ready:
            self.notify(self.draftpen.engine_status, severity="warning")
            return
        history = self.draftpen.history
        try:
            if self.chat_id is None:
                chat = history.create_chat(_title_from(event.text), pair=self.draftpen.pair_name)
                self.chat_id = chat.id
                self.sub_title = chat.title
            user_message = history.add_message(self.chat_id, "user", event.text)
            reply_message = history.add_message(self.chat_id, "assistant", "", state=WRITING)
        except HistoryError as error:
            # The message stays in the prompt box, so nothing the person typed is lost.
            self.notify(str(error), title="Not sent", severity="error", timeout=15)
            return
        self.query_one(PromptInput).clear()
        conversation = self.query_one("#conversation", VerticalScroll)
        reply_view = MessageView("assistant", state=WRITING, message_id=reply_message.id)
        await conversation.mount_all([_view_for(user_message), reply_view])
        conversation.scroll_end(animate=False)
        self.refresh_chat_list()
        self.reply = ReplyInProgress(reply_message.id, self.chat_id, reply_view)
        self.rolling_rate.reset()
        self.rolling_rate.add(0)
        self._write_reply(client, self._turn(), self.reply)
        self._refresh_timer = self.set_interval(REFRESH_SECONDS, self._refresh_reply)
        # A blinking cursor repaints the prompt twice a second: steady while writing.
        self.query_one(PromptInput).cursor_blink = False
        self.priority.lower()

    def _turn(self) -> ChatTurn:
        """What to ask the engine for: the open chat and how to write the reply.

        The engine leaves out the oldest turns that do not fit its context (the history
        keeps them).
        """
        settings = self.draftpen.settings
        return ChatTurn(
            pair=self.draftpen.pair_name,
            messages=tuple(self._conversation()),
            params=settings.sampling_params(),
            max_tokens=settings.max_tokens,
            drafter=settings.drafter,
            draft_tokens=settings.draft_tokens,
            fit_context=True,
            exact=settings.exact_output,
            thinking=settings.thinking,
        )

    def _conversation(self) -> list[ChatMessage]:
        """The open chat as the model sees it: system prompt, then every usable turn."""
        assert self.chat_id is not None
        system = self.draftpen.settings.system_prompt
        messages = [ChatMessage("system", system)] if system.strip() else []
        for message in self.draftpen.history.messages(self.chat_id):
            if message.role != "system" and message.content and message.state != FAILED:
                messages.append(ChatMessage(message.role, message.content))
        return messages

    @work(thread=True, exclusive=True, group="reply", exit_on_error=False)
    def _write_reply(self, client: EngineClient, turn: ChatTurn, reply: ReplyInProgress) -> None:
        """Stream the reply from the engine, gathering it into ``reply`` (runs in a thread)."""
        try:
            stream = client.chat(turn, reply.cancel)
            splitter: ReasoningSplitter | None = None
            generated = 0
            for item in stream:
                if isinstance(item, Waiting):
                    self.post_message(self.ReplyNotice(reply.message_id, waiting_text(item)))
                elif isinstance(item, Loading):
                    text = f"The engine is loading {turn.pair}: {item.text}…"
                    self.post_message(self.ReplyNotice(reply.message_id, text))
                else:
                    first = reply.last_event is None
                    if first and stream.reasoning is not None:  # known with the first event
                        splitter = ReasoningSplitter(stream.reasoning)
                    if first and stream.left_out_messages:  # known with the first event too
                        left_out = stream.left_out_messages
                        self.post_message(self.ContextFitted(reply.message_id, left_out))
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
                        self.post_message(self.ReplyStarted(reply.message_id))
            self.post_message(self.ReplyFinished(reply.message_id))
        except EngineCrashedError as error:
            self.post_message(
                self.ReplyLost(reply.message_id, str(error), crashed=True, gives_up=error.gives_up)
            )
        except EngineLost as error:
            self.post_message(self.ReplyLost(reply.message_id, str(error)))
        except (DraftpenError, ValueError) as error:
            self.post_message(self.ReplyFailed(reply.message_id, str(error)))
        except Exception as error:  # a bug: say so, and keep what was written
            self.post_message(
                self.ReplyFailed(reply.message_id, f"unexpected {type(error).__name__}: {error}")
            )

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
        what = "the runtime crashed" if message.crashed else "the engine stopped"
        await self._keep_unfinished(reply, INTERRUPTED, note=f"interrupted: {what}")
        self.notify(
            f"{message.error} What it wrote is kept; the chat is intact.",
            title=f"{what.capitalize()} mid-reply",
            severity="error",
            timeout=30 if message.crashed else 15,
        )
        self._reply_ended()
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
            self.post_message(self.ReplyFinished(self.reply.message_id))

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
        self.query_one(StatsBar).show_live(figures, self.rolling_rate.rate())
        if time.monotonic() - reply.last_saved >= SAVE_INTERVAL_SECONDS:
            with self._saving():
                self.draftpen.history.update_message(
                    reply.message_id,
                    content=content,
                    segments=segments,
                    reasoning=reply.reasoning_so_far()[0],
                )
            reply.last_saved = time.monotonic()

    # -- copy and export ----------------------------------------------------------------

    def _last_reply_text(self) -> str | None:
        views = [view for view in self.query(MessageView) if view.role == "assistant"]
        return views[-1].content if views and views[-1].content else None

    def action_copy_reply(self) -> None:
        """Copy the last reply to the clipboard."""
        text = self._last_reply_text()
        if text is None:
            self.notify("There is no reply to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(text)
        self.notify("Last reply copied to the clipboard.")

    def action_copy_code(self) -> None:
        """Copy the last code block of the last reply to the clipboard."""
        code = last_code_block(self._last_reply_text() or "")
        if code is None:
            self.notify("The last reply has no code block.", severity="warning")
            return
        self.app.copy_to_clipboard(code)
        self.notify("Code block copied to the clipboard.")

    def action_export(self) -> None:
        """Write the open chat to a Markdown file and say where."""
        if self.chat_id is None:
            self.notify("Nothing to export yet: this chat is empty.", severity="warning")
            return
        history = self.draftpen.history
        chat = history.chat(self.chat_id)
        path = export_path(data_dir() / "exports", chat)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(chat_to_markdown(chat, history.messages(chat.id)), encoding="utf-8")
        except OSError as error:
            self.notify(
                f"Could not export to {path}: {error.strerror or error}. Free some space "
                "or set DRAFTPEN_HOME to a writable place.",
                severity="error",
            )
            return
        self.last_export = path
        self.notify(f"Exported to {path}", title="Export")


def waiting_text(waiting: Waiting) -> str:
    """What the stats bar says while the reply waits in the engine's queue."""
    ahead = ", ".join(waiting.ahead) if waiting.ahead else "other requests"
    return f"Waiting for the engine: {waiting.position} ahead ({ahead})…"


def _view_for(message: StoredMessage) -> MessageView:
    figures = ReplyFigures.from_dict(message.stats) if message.stats else None
    return MessageView(
        message.role,
        message.content,
        segments=list(message.segments) or None,
        figures=figures,
        state=message.state,
        message_id=message.id,
        reasoning=message.reasoning,
    )


def _title_from(text: str) -> str:
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return (first_line[:48] + "…") if len(first_line) > 48 else (first_line or NEW_CHAT_TITLE)
