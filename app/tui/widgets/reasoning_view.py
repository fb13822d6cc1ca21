"""A thinking model's reasoning, dimmed and collapsible, shown above its answer.

While the model reasons the block is open, so the reasoning can be read as it streams;
it collapses by itself once, when the answer starts, and after that stays as the
person leaves it (a click or Enter on its title opens it again). While it grows its
text redraws in place, as a reply's live tail does (``app.tui.widgets.live_tail``).
Its styles live here rather than in app.tcss so the widget is one self-contained piece.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Collapsible

from app.tui.widgets.live_tail import LiveTail

THINKING_TITLE = "Thinking…"


def reasoning_title(tokens: int) -> str:
    """The title once the answer has started: how long the model thought."""
    return f"Reasoning ({tokens:,} tokens)" if tokens else "Reasoning"


def thinking_title(tokens: int) -> str:
    """The title while the model is still thinking, with the tokens so far."""
    return f"{THINKING_TITLE} ({tokens:,} tokens)" if tokens else THINKING_TITLE


class ReasoningView(Collapsible):
    """The reasoning before an answer; collapsed once the answer starts."""

    DEFAULT_CSS = """
    ReasoningView {
        background: transparent;
        border-top: none;
        padding: 0;
        margin: 0 0 1 0;
    }
    ReasoningView > Contents {
        padding: 0 0 0 2;
    }
    ReasoningView CollapsibleTitle {
        color: $text-muted;
        padding: 0;
    }
    ReasoningView .reasoning-text {
        color: $text-muted;
        text-style: italic;
    }
    """

    def __init__(
        self,
        reasoning: str = "",
        *,
        answered: bool = True,
        tokens: int = 0,
        collapsed: bool | None = None,
    ) -> None:
        title = reasoning_title(tokens) if answered else thinking_title(tokens)
        # Kept, not queried: an update may come before the block's children are mounted.
        self._text = LiveTail(reasoning, classes="reasoning-text")
        super().__init__(
            self._text,
            title=title,
            collapsed=answered if collapsed is None else collapsed,
            classes="reasoning",
        )
        self.reasoning = reasoning
        self.answered = answered

    def show(self, reasoning: str, *, answered: bool, tokens: int = 0) -> None:
        """Show the reasoning so far; the first time the answer has started, collapse."""
        if reasoning != self.reasoning:
            self.reasoning = reasoning
            if answered or not self._text.is_mounted:
                self._text.update(reasoning)
            else:  # still thinking, the block open: redraw in place
                self._text.show(Text(reasoning))
        if answered and not self.answered:
            self.answered = True
            self.collapsed = True
            self._text.settle()
        self.title = reasoning_title(tokens) if self.answered else thinking_title(tokens)

    def finish(self, tokens: int) -> None:
        """The reply ended (perhaps stopped mid-thought): title it, leave it open or shut."""
        self.answered = True
        self._text.settle()
        self.title = reasoning_title(tokens)
