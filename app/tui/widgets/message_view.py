"""One message of the conversation: Markdown, or text tinted by provenance."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Label, Markdown, Static

from app.chats.export import last_code_block
from app.chats.history import FAILED, INTERRUPTED, STOPPED
from app.tui.reply import ReplyFigures

ROLE_LABELS = {"user": "You", "assistant": "draftpen", "system": "System"}
STATE_NOTES = {
    STOPPED: "stopped",
    INTERRUPTED: "interrupted (draftpen closed while writing)",
    FAILED: "failed",
}
# Tokens the target accepted from the draft, and tokens it produced itself.
DRAFT_STYLE = "bold #7ee787 on #12301c"
TARGET_STYLE = ""


def provenance_text(segments: list[tuple[str, bool]]) -> Text:
    """The reply as text, draft-accepted runs tinted."""
    text = Text()
    for piece, from_draft in segments:
        text.append(piece, style=DRAFT_STYLE if from_draft else TARGET_STYLE)
    return text


class MessageView(Vertical, can_focus=True):
    """A message. Focus it (Tab / click) to copy it or its last code block."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "copy_message", "Copy message"),
        Binding("k", "copy_code", "Copy last code block"),
    ]

    def __init__(
        self,
        role: str,
        content: str = "",
        *,
        segments: list[tuple[str, bool]] | None = None,
        figures: ReplyFigures | None = None,
        state: str = "",
        message_id: int | None = None,
    ) -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.content = content
        self.segments = list(segments) if segments else ([(content, False)] if content else [])
        self.figures = figures
        self.state = state
        self.message_id = message_id

    def compose(self) -> ComposeResult:
        yield Label(self._heading(), classes="heading")
        yield Markdown(self.content, classes="markdown")
        yield Static(provenance_text(self.segments), classes="provenance")
        yield Static(self.footer_text, classes="footer", markup=False)

    def _heading(self) -> str:
        note = STATE_NOTES.get(self.state)
        return ROLE_LABELS.get(self.role, self.role) + (f"  ({note})" if note else "")

    @property
    def footer_text(self) -> str:
        """The figures line under a finished reply (empty for other messages)."""
        return self.figures.summary() if self.figures is not None else ""

    async def append(self, segments: list[tuple[str, bool]], content: str) -> None:
        """Show newly written text (``segments`` and ``content`` are the whole reply so far)."""
        added = content[len(self.content) :]
        self.content = content
        self.segments = segments
        if self.app.has_class("-provenance"):
            self.query_one(".provenance", Static).update(provenance_text(segments))
        if added:
            await self.query_one(".markdown", Markdown).append(added)

    def finish(self, figures: ReplyFigures | None, state: str) -> None:
        """The reply ended: attach its final figures and state."""
        self.figures = figures
        self.state = state
        self.query_one(".heading", Label).update(self._heading())
        self.query_one(".footer", Static).update(self.footer_text)
        self.set_class(bool(self.footer_text), "-has-footer")

    def show_provenance(self, enabled: bool) -> None:
        """Bring the tinted view up to date before it is shown."""
        if enabled:
            self.query_one(".provenance", Static).update(provenance_text(self.segments))

    def on_mount(self) -> None:
        self.set_class(bool(self.footer_text), "-has-footer")

    def action_copy_message(self) -> None:
        """Copy the whole message to the clipboard."""
        self.app.copy_to_clipboard(self.content)
        self.notify("Message copied to the clipboard.")

    def action_copy_code(self) -> None:
        """Copy the message's last code block to the clipboard."""
        code = last_code_block(self.content)
        if code is None:
            self.notify("This message has no code block.", severity="warning")
            return
        self.app.copy_to_clipboard(code)
        self.notify("Code block copied to the clipboard.")
