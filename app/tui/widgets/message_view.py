"""One message of the conversation: Markdown, or text tinted by provenance.

While a reply is written only its completed Markdown blocks are rendered, each once;
the unfinished tail is one cheap text widget (tinted spans when draft colours are on)
that redraws in place (``app.tui.widgets.live_tail``). Re-rendering all of a growing
reply's Markdown several times a second took CPU from decoding (see
``app.tui.live_text``). Only the view that is shown is kept up to date while a reply
is written (Markdown, or the tinted text); the other catches up when it is shown.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Label, Markdown, Static

from app.chats.export import last_code_block
from app.chats.history import FAILED, INTERRUPTED, STOPPED
from app.tui.live_text import completed_length, split_segments
from app.tui.reply import ReplyFigures
from app.tui.widgets.live_tail import LiveTail
from app.tui.widgets.reasoning_view import ReasoningView

ROLE_LABELS = {"user": "You", "assistant": "draftpen", "system": "System"}
STATE_NOTES = {
    STOPPED: "stopped",
    INTERRUPTED: "interrupted (draftpen or its engine stopped while writing)",
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
        reasoning: str = "",
    ) -> None:
        super().__init__(classes=f"message {role}")
        # A thinking model's reasoning, shown apart above the answer (ReasoningView).
        self.reasoning = reasoning
        self.role = role
        self.content = content
        self.segments = list(segments) if segments else ([(content, False)] if content else [])
        self.figures = figures
        self.state = state
        self.note: str | None = None  # says more than the state's usual note
        self.message_id = message_id
        # How much of ``content`` is complete blocks (the rest is the live tail), and
        # how much of that the Markdown widget holds (it lags while draft colours are
        # shown instead). A stored message is shown whole.
        self.rendered_length = len(self.content)
        self.markdown_length = len(self.content)

    def compose(self) -> ComposeResult:
        yield Label(self._heading(), classes="heading")
        if self.reasoning:
            reasoning_tokens = self.figures.reasoning_tokens if self.figures else 0
            # Shut above an answer; open when the reply was stopped before answering.
            yield ReasoningView(
                self.reasoning, tokens=reasoning_tokens, collapsed=bool(self.content)
            )
        yield Markdown(self.content, classes="markdown")
        yield Static(provenance_text(self.segments), classes="provenance")
        yield LiveTail(classes="tail")
        yield Static(self.footer_text, classes="footer", markup=False)

    def _heading(self) -> str:
        note = self.note or STATE_NOTES.get(self.state)
        return ROLE_LABELS.get(self.role, self.role) + (f"  ({note})" if note else "")

    @property
    def footer_text(self) -> str:
        """The figures line under a finished reply (empty for other messages)."""
        return self.figures.summary() if self.figures is not None else ""

    @property
    def tail_text(self) -> str:
        """The written text not yet rendered as Markdown (the unfinished block)."""
        return self.content[self.rendered_length :]

    async def append(
        self, segments: list[tuple[str, bool]], content: str, *, complete: bool = False
    ) -> bool:
        """Show the reply so far (``segments`` and ``content`` are all of it).

        Completed blocks go to the Markdown widget once; the rest is the live tail.
        ``complete`` (the reply ended) renders everything. Returns whether the view's
        height may have changed (blocks added, the tail resized): else only the tail's
        own lines were repainted.
        """
        self.content = content
        self.segments = segments
        boundary = len(content) if complete else completed_length(content, self.rendered_length)
        tints = self.app.has_class("-provenance")
        blocks_added = boundary > self.rendered_length
        if blocks_added:
            self.rendered_length = boundary
            if tints:
                self._show_tinted_blocks()
            else:
                await self._catch_up_markdown()
        tail = self.query_one(LiveTail)
        if complete:
            tail.finish()
            return True
        resized = tail.show(self._tail_content(tints), resize=blocks_added)
        return blocks_added or resized

    async def _catch_up_markdown(self) -> None:
        """Hand the Markdown widget the completed blocks it does not hold yet."""
        if self.markdown_length < self.rendered_length:
            added = self.content[self.markdown_length : self.rendered_length]
            self.markdown_length = self.rendered_length
            await self.query_one(".markdown", Markdown).append(added)

    def _show_tinted_blocks(self) -> None:
        head, _ = split_segments(self.segments, self.rendered_length)
        text = provenance_text(head)
        if self.rendered_length < len(self.content) and text.plain.endswith("\n"):
            # The tail's widget starts on a line of its own: a head ending in a newline
            # would otherwise show an empty line too many between them.
            text.right_crop(1)
        self.query_one(".provenance", Static).update(text)

    def _tail_content(self, tints: bool) -> Text:
        if tints:
            _, tail = split_segments(self.segments, self.rendered_length)
            return provenance_text(tail)
        return Text(self.tail_text)

    async def show_reasoning(self, reasoning: str, *, answered: bool, tokens: int = 0) -> None:
        """Show the reasoning so far above the answer (collapsed once the answer starts)."""
        self.reasoning = reasoning
        views = self.query(ReasoningView)
        if views:
            views.first().show(reasoning, answered=answered, tokens=tokens)
        else:
            view = ReasoningView(reasoning, answered=answered, tokens=tokens)
            await self.mount(view, before=self.query_one(".markdown", Markdown))

    def finish(self, figures: ReplyFigures | None, state: str, *, note: str | None = None) -> None:
        """The reply ended: attach its final figures and state (``note``: why, if unusual)."""
        self.figures = figures
        self.state = state
        self.note = note
        for reasoning in self.query(ReasoningView):
            reasoning.finish(figures.reasoning_tokens if figures else 0)
        self.query_one(".heading", Label).update(self._heading())
        self.query_one(".footer", Static).update(self.footer_text)
        self.set_class(bool(self.footer_text), "-has-footer")

    async def show_provenance(self, enabled: bool) -> None:
        """Bring the tinted view (or the Markdown and plain tail) up to date to be shown."""
        if enabled:
            self._show_tinted_blocks()
        else:
            await self._catch_up_markdown()
        tail = self.query_one(LiveTail)
        if tail.display:  # a reply being written
            tail.show(self._tail_content(enabled))

    def on_mount(self) -> None:
        self.set_class(bool(self.footer_text), "-has-footer")
        self.query_one(LiveTail).display = False

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
