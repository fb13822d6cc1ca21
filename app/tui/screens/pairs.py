"""The model-pair picker: the catalog's pairs, their download state, pick one to load."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option


@dataclass(frozen=True)
class PairChoice:
    """A pair as the picker shows it."""

    name: str
    description: str
    state: str  # "downloaded", "partial" or "absent"

    @property
    def ready(self) -> bool:
        """Whether the pair can be loaded now."""
        return self.state == "downloaded"


class PairPickerScreen(ModalScreen[str | None]):
    """Pick a downloaded pair; pairs not downloaded are listed with the command to get them."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, choices: Sequence[PairChoice], current: str | None) -> None:
        super().__init__()
        self.choices = list(choices)
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog pairs"):
            yield Label("Model pairs (Enter loads a downloaded pair)")
            yield OptionList(
                *(
                    Option(self._describe(choice), id=choice.name, disabled=not choice.ready)
                    for choice in self.choices
                ),
                id="pair-list",
            )

    def _describe(self, choice: PairChoice) -> Text:
        marker = "●" if choice.name == self.current else " "
        if choice.ready:
            state = "downloaded"
        else:
            state = f"{choice.state}: draftpen models pull {choice.name}"
        return Text(f"{marker} {choice.name}  ({state})\n    {choice.description}")

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        """Keep the current pair."""
        self.dismiss(None)
