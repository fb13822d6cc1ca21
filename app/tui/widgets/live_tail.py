"""The live tail of a reply being written: a text widget that grows in steps.

A widget whose height changes makes Textual lay the screen out again and repaint
everything that moved, which, in a conversation that follows the newest line, is the
whole conversation: on a small CPU the chat app's largest cost while a reply streams.
So the tail keeps a few empty lines in hand below its text. While new text fits in
them, an update repaints only the tail's own lines; when it does not, the tail takes
:data:`RESERVE_LINES` more at once (one layout), and gives back what it does not need
when a completed block leaves it for the Markdown above (a layout happens then anyway).
"""

from __future__ import annotations

from rich.text import Text
from textual.geometry import Size
from textual.widgets import Static

# Empty lines kept below the text: how many lines the tail can grow by before the
# screen is laid out again. About 4 seconds of prose at 30 tokens a second.
RESERVE_LINES = 6


class LiveTail(Static):
    """The unfinished end of a reply: plain or tinted text, redrawn in place."""

    DEFAULT_CSS = """
    LiveTail {
        height: auto;
    }
    """

    def __init__(self, *, classes: str | None = None) -> None:
        super().__init__("", classes=classes, markup=False)
        # Lines the tail holds now (its text plus the reserve); 0 while its height is
        # left to the stylesheet (hidden, or not laid out yet).
        self.reserved_lines = 0
        # Layouts the tail asked for, and redraws that needed none (read by tests).
        self.layouts = 0
        self.redraws = 0

    def show(self, content: Text, *, resize: bool = False) -> bool:
        """Show ``content``: in place if it fits the lines held, else with more lines.

        ``resize`` (a layout happens anyway, say a block moved to the Markdown above)
        lets the tail give back lines it no longer needs. Returns whether the tail's
        height changed (the screen is laid out again), False when it redrew in place.
        """
        width = self._text_width()
        self.update(content, layout=False)
        if not self.display:
            self.display = True
            resize = True
        if width <= 0:  # not laid out yet: let the layout size it, measure next time
            self._hold(None)
            return True
        needed = self.get_content_height(Size(width, 0), self.app.size, width)
        if needed > self.reserved_lines or resize:
            return self._hold(needed + RESERVE_LINES) or resize
        self.redraws += 1
        return False

    def finish(self) -> None:
        """The reply ended: hide the tail and give its lines back."""
        self.update("", layout=False)
        self.display = False
        self._hold(None)

    def _hold(self, lines: int | None) -> bool:
        """Set the tail's height to ``lines`` (None: as the stylesheet says).

        Returns whether it changed.
        """
        if lines == (self.reserved_lines or None):
            return False
        self.reserved_lines = lines or 0
        self.styles.height = lines  # a style change lays the screen out once
        self.layouts += 1
        return True

    def _text_width(self) -> int:
        """Columns the text wraps at: the tail's own, or its parent's before layout."""
        width = self.content_size.width
        if width <= 0 and self.parent is not None:
            width = getattr(self.parent, "content_size", Size(0, 0)).width
        return width
