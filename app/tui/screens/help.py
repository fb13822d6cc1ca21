"""Every key binding, gathered from the classes that declare them (so it stays complete)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static


def describe_bindings(sections: list[tuple[str, list[BindingType]]]) -> str:
    """A plain-text table of key bindings, one section per place they apply."""
    lines: list[str] = []
    for title, bindings in sections:
        lines.append(title)
        # Every binding in draftpen is declared as a Binding, never as a bare tuple.
        for binding in (item for item in bindings if isinstance(item, Binding)):
            keys = ", ".join(key.strip() for key in binding.key.split(","))
            lines.append(f"  {keys:<24} {binding.description or binding.action}")
        lines.append("")
    lines.append("Ctrl+P opens the command palette, which lists every action.")
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    """The key bindings; any of Escape, F1 or Q closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,f1,q", "dismiss", "Close help")]

    def __init__(self, sections: list[tuple[str, list[BindingType]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help"):
            yield Label("draftpen: keys")
            yield Static(describe_bindings(self.sections), id="help-text", markup=False)

    async def action_dismiss(self, result: None = None) -> None:
        """Close the help screen."""
        self.dismiss(result)
