"""The chat screen: chat list, conversation, prompt and live statistics.

Generation runs in a thread worker that drives the shared speculative loop through
:meth:`Engine.generate` and posts each event back (``post_message`` is thread-safe);
everything that touches widgets or the history database happens here, on the UI thread.
The reply is saved as it grows (at most half a second behind), so a crash keeps it.
"""

from __future__ import annotations

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
from textual.widgets import Footer, Header

from app.chats.conversation import fit_conversation
from app.chats.export import chat_to_markdown, export_path, last_code_block
from app.chats.history import COMPLETE, FAILED, STOPPED, WRITING, History, StoredMessage
from app.errors import DraftpenError, HistoryError
from app.rates import RollingRate
from app.settings import Settings, data_dir
from app.tui.reply import ReplyFigures, merge_segments
from app.tui.screens.dialogs import ConfirmDialog, RenameDialog
from app.tui.widgets.chat_list import ChatList
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.stats_bar import StatsBar
from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.errors import BackendError
from backends.speculative import FINISH_CANCELLED, GenerationEvent


class ChatHost(Protocol):
    """What the chat screen needs of the app that shows it (the app implements it).

    Declared here, not imported from ``app.tui.app``, so the app imports the screen
    and never the other way round.
    """

    history: History
    settings: Settings
    pair_name: str
    engine: Engine | None
    engine_status: str

    def load_pair(self, pair_name: str) -> None:
        """Load ``pair_name`` behind the UI, replacing the current pair."""
        ...


NEW_CHAT_TITLE = "New chat"
SAVE_INTERVAL_SECONDS = 0.5
# The reply's text and the stats bar are redrawn together, on one timer: every redraw
# renders the screen on the UI thread, which takes CPU that CPU decoding needs.
REFRESH_SECONDS = 0.25


@dataclass
class ReplyInProgress:
    """The reply being written: where it is shown and stored, and what it has so far."""

    message_id: int
    chat_id: int
    view: MessageView
    cancel: threading.Event = field(default_factory=threading.Event)
    segments: list[tuple[str, bool]] = field(default_factory=list)
    content: str = ""
    last_event: GenerationEvent | None = None
    last_saved: float = 0.0


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
    class ReplyUpdate(Message):
        """The loop produced ``event`` for the reply stored as ``message_id``."""

        message_id: int
        event: GenerationEvent

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
        self.set_interval(REFRESH_SECONDS, self._refresh_reply)
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
        engine = self.draftpen.engine
        if self.reply is not None:
            self.notify("Still writing: press Esc to stop first.", severity="warning")
            return
        if engine is None:
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
        self._write_reply(engine, self._conversation(), self.draftpen.settings, self.reply)

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
    def _write_reply(
        self,
        engine: Engine,
        conversation: list[ChatMessage],
        settings: Settings,
        reply: ReplyInProgress,
    ) -> None:
        """Run the shared loop and post every event to the UI (runs in a thread)."""
        try:
            prompt = fit_conversation(engine, conversation, settings.max_tokens)
            if prompt.dropped_messages:
                self.app.call_from_thread(
                    self.notify,
                    f"The chat is longer than the context: the oldest {prompt.dropped_messages} "
                    "messages were left out of this prompt (they stay in the history).",
                )
            request = GenerationRequest(
                prompt_tokens=prompt.tokens,
                params=settings.sampling_params(),
                max_tokens=settings.max_tokens,
                drafter=settings.drafter,
                draft_tokens=settings.draft_tokens,
                exact=settings.exact_output,
            )
            for event in engine.generate(request, reply.cancel):
                self.post_message(self.ReplyUpdate(reply.message_id, event))
        except (BackendError, DraftpenError, ValueError) as error:
            self.post_message(self.ReplyFailed(reply.message_id, str(error)))
        except Exception as error:  # a bug: say so, and keep what was written
            self.post_message(
                self.ReplyFailed(reply.message_id, f"unexpected {type(error).__name__}: {error}")
            )

    @on(ReplyUpdate)
    async def _reply_update(self, message: ReplyUpdate) -> None:
        reply = self.reply
        if reply is None or reply.message_id != message.message_id:
            return
        event = message.event
        merge_segments(reply.segments, event.segments)
        reply.content += event.text
        first_event = reply.last_event is None
        reply.last_event = event
        if first_event:  # replace "Ready" at once; the timer keeps it fresh from here
            self._refresh_live_stats()
        self.rolling_rate.add(event.stats.generated_tokens)
        if event.finish_reason is not None:
            await self._show_reply_text()
            self._finish_reply(reply, event)
        elif time.monotonic() - reply.last_saved >= SAVE_INTERVAL_SECONDS:
            with self._saving():
                self.draftpen.history.update_message(
                    reply.message_id, content=reply.content, segments=reply.segments
                )
            reply.last_saved = time.monotonic()

    async def _show_reply_text(self) -> None:
        """Bring the reply's view up to date with the text received so far."""
        reply = self.reply
        if reply is None or not reply.view.is_attached or reply.view.content == reply.content:
            return
        conversation = self.query_one("#conversation", VerticalScroll)
        following = conversation.is_vertical_scroll_end
        await reply.view.append(reply.segments, reply.content)
        if following:
            conversation.scroll_end(animate=False)

    def _finish_reply(self, reply: ReplyInProgress, event: GenerationEvent) -> None:
        figures = ReplyFigures.from_event(event)
        state = STOPPED if event.finish_reason == FINISH_CANCELLED else COMPLETE
        with self._saving():
            self.draftpen.history.update_message(
                reply.message_id,
                content=reply.content,
                segments=reply.segments,
                state=state,
                stats={**figures.as_dict(), "loop": event.stats.as_dict()},
            )
        if reply.view.is_attached:
            reply.view.finish(figures, state)
        self.query_one(StatsBar).show_final(figures)
        self.reply = None

    @on(ReplyFailed)
    def _reply_failed(self, message: ReplyFailed) -> None:
        reply = self.reply
        if reply is None or reply.message_id != message.message_id:
            return
        with self._saving():
            self.draftpen.history.update_message(
                reply.message_id, content=reply.content, segments=reply.segments, state=FAILED
            )
        if reply.view.is_attached:
            reply.view.finish(None, FAILED)
        self.query_one(StatsBar).show_status(f"error: {message.error}")
        self.notify(message.error, title="Generation failed", severity="error", timeout=10)
        self.reply = None

    @contextmanager
    def _saving(self) -> Iterator[None]:
        """Report a history write that failed (a full disk); the screen keeps the text."""
        try:
            yield
        except HistoryError as error:
            self.notify(str(error), title="Not saved", severity="error", timeout=15)

    def action_stop(self) -> None:
        """Stop the reply now (at the end of the current round); what was written stays."""
        if self.reply is not None:
            self.reply.cancel.set()

    def _stop_for(self, purpose: str) -> None:
        if self.reply is not None and not self.reply.cancel.is_set():
            self.reply.cancel.set()
            self.notify(f"Stopped the reply to {purpose}; what it wrote is kept.")

    async def _refresh_reply(self) -> None:
        """The timer's tick: the reply's new text and the live figures, in one redraw."""
        await self._show_reply_text()
        self._refresh_live_stats()

    def _refresh_live_stats(self) -> None:
        reply = self.reply
        if reply is not None and reply.last_event is not None:
            figures = ReplyFigures.from_event(reply.last_event)
            self.query_one(StatsBar).show_live(figures, self.rolling_rate.rate())

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


def _view_for(message: StoredMessage) -> MessageView:
    figures = ReplyFigures.from_dict(message.stats) if message.stats else None
    return MessageView(
        message.role,
        message.content,
        segments=list(message.segments) or None,
        figures=figures,
        state=message.state,
        message_id=message.id,
    )


def _title_from(text: str) -> str:
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return (first_line[:48] + "…") if len(first_line) > 48 else (first_line or NEW_CHAT_TITLE)
