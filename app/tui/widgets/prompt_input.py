"""The multi-line prompt: Enter sends, Shift+Enter or Ctrl+J starts a new line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    """A text area that sends its text on Enter."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # Priority: TextArea would otherwise take Enter as a new line.
        Binding("enter", "submit", "Send", priority=True),
        Binding("shift+enter,ctrl+j", "newline", "New line", priority=True, show=False),
    ]

    @dataclass
    class Submitted(Message):
        """The user sent ``text`` (never blank). The box keeps it until it is accepted."""

        text: str

    def __init__(self, **kwargs: object) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, **kwargs)  # type: ignore[arg-type]

    def action_submit(self) -> None:
        """Send the text (unless it is blank); the receiver clears the box if it takes it.

        Enter is a priority binding, so the app runs this as soon as it reads the key,
        while letters that came in the same read may still wait in this box's queue
        (a paste ending in a newline): the text is looked at once they are in."""
        self.call_later(self._submit_typed)

    def _submit_typed(self) -> None:
        if not self.text.strip():
            return
        self.post_message(self.Submitted(self.text))

    def action_newline(self) -> None:
        """Insert a line break at the cursor."""
        self.insert("\n")
