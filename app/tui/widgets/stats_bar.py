"""The live statistics line under the conversation."""

from __future__ import annotations

from textual.widgets import Static

from app.tui.reply import ReplyFigures
from backends.speculation.cost_audit import COSTS_NOTE_PREFIX


class StatsBar(Static):
    """Shows what the engine is doing: loading, writing (live figures), or the last reply.

    One line high, so an update repaints that line and never lays the screen out.
    """

    DEFAULT_CSS = """
    StatsBar {
        height: 1;
    }
    """

    def show_status(self, text: str) -> None:
        """A plain status line (loading, ready, an error)."""
        self.update(text, layout=False)

    def show_live(
        self, figures: ReplyFigures, rolling_tokens_per_second: float, others_writing: int = 0
    ) -> None:
        """Figures while a reply is written; the rate is the rolling one, not per round.

        ``others_writing``: other requests the engine writes meanwhile (the rate is
        this reply's share of the machine, so say why it is lower)."""
        drafter = figures.drafter if figures.draft_length > 0 else "none"
        beside = ""
        if others_writing > 0:
            plural = "s" if others_writing > 1 else ""
            beside = f" · engine busy: beside {others_writing} other request{plural}"
        if figures.costs_note:
            beside += " · auto re-measured its figures"
        self.update(
            f"{rolling_tokens_per_second:.1f} tok/s · "
            f"accepted {figures.acceptance_rate:.0%} · "
            f"mean accepted length {figures.mean_accepted_length:.2f} · "
            f"K={figures.draft_length} {drafter} · "
            f"est. speedup {figures.estimated_speedup:.2f}x{beside}",
            layout=False,
        )

    def show_final(self, figures: ReplyFigures) -> None:
        """The finished reply's figures (whole-reply decode rate), and what `auto`
        corrected in its stored figures during the reply, if anything."""
        corrected = f" · {COSTS_NOTE_PREFIX}{figures.costs_note}" if figures.costs_note else ""
        self.update(f"last reply: {figures.summary()}{corrected}", layout=False)
