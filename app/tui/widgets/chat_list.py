"""The sidebar list of chats."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Label, ListItem, ListView

from app.chats.history import Chat


class ChatListItem(ListItem):
    """One chat in the list."""

    def __init__(self, chat: Chat) -> None:
        super().__init__(Label(chat.title, markup=False))
        self.chat = chat


class ChatList(ListView):
    """Every chat, most recent first; Enter opens, R renames, Delete deletes."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "rename", "Rename chat"),
        Binding("delete,d", "delete", "Delete chat"),
    ]

    @dataclass
    class RenameRequested(Message):
        """The user wants to rename ``chat``."""

        chat: Chat

    @dataclass
    class DeleteRequested(Message):
        """The user wants to delete ``chat``."""

        chat: Chat

    def show_chats(self, chats: Sequence[Chat], selected_id: int | None) -> None:
        """Replace the list, keeping ``selected_id`` highlighted."""
        self.clear()
        self.extend(ChatListItem(chat) for chat in chats)
        ids = [chat.id for chat in chats]
        if selected_id in ids:
            self.index = ids.index(selected_id)

    def _highlighted_chat(self) -> Chat | None:
        item = self.highlighted_child
        return item.chat if isinstance(item, ChatListItem) else None

    def action_rename(self) -> None:
        """Ask to rename the highlighted chat."""
        chat = self._highlighted_chat()
        if chat is not None:
            self.post_message(self.RenameRequested(chat))

    def action_delete(self) -> None:
        """Ask to delete the highlighted chat."""
        chat = self._highlighted_chat()
        if chat is not None:
            self.post_message(self.DeleteRequested(chat))
