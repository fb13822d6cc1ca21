"""The chat screen: chat list, conversation, prompt and live statistics.

It composes the screen and holds its key bindings; it opens, switches, renames and
deletes chats (the chat list and the conversation's messages), sends what is typed in
the prompt, and copies and exports. Writing the reply (the worker that streams it, the
timer that draws it, saving and ending it) is the ``ReplyWritingScreen`` it builds on.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header

from app.chats.export import chat_to_markdown, export_path, last_code_block
from app.chats.history import FAILED, WRITING, StoredMessage
from app.client import ChatTurn
from app.errors import HistoryError
from app.settings import data_dir
from app.tui.reply import ReplyFigures
from app.tui.screens.dialogs import ConfirmDialog, RenameDialog
from app.tui.screens.reply_writing import ReplyWritingScreen
from app.tui.streaming import ReplyInProgress
from app.tui.widgets.chat_list import ChatList
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.stats_bar import StatsBar
from backends.base import ChatMessage

NEW_CHAT_TITLE = "New chat"


class ChatScreen(ReplyWritingScreen):
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

    def __init__(self) -> None:
        super().__init__()
        self.chat_id: int | None = None
        self.last_export: Path | None = None

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

    # -- sending ---------------------------------------------------------------------

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
        reply = ReplyInProgress(reply_message.id, self.chat_id, reply_view)
        self._start_reply(client, self._turn(), reply)

    def _turn(self) -> ChatTurn:
        """What to ask the engine for: the open chat and how to write the reply.

        The engine leaves out the oldest turns that do not fit its context (the history
        keeps them).
        """
        settings = self.draftpen.settings
        return ChatTurn(
            pair=self.draftpen.pair_name,
            messages=tuple(self._conversation()),
            params=settings.sampling,
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
        reasoning=message.reasoning,
    )


def _title_from(text: str) -> str:
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return (first_line[:48] + "…") if len(first_line) > 48 else (first_line or NEW_CHAT_TITLE)
