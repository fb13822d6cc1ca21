"""The settings screen: sampling, drafting, thinking, system prompt; saved to settings.toml."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, TextArea

from app.errors import SettingsError
from app.settings import DRAFTER_CHOICES, Settings

# (field, label, hint) for the fields edited as one-line inputs, in screen order.
NUMBER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("temperature", "Temperature", "0 = always the likeliest token"),
    ("top_p", "Top-p", "above 0, at most 1"),
    ("top_k", "Top-k", "0 = no limit"),
    ("min_p", "Min-p", "0 to 1"),
    ("max_tokens", "Max tokens", "per reply"),
    ("draft_tokens", "Draft length K", "draft tokens per round for model/n-gram; auto chooses"),
)
EXACT_OUTPUT_CHOICES = (
    ("fastest kernels, any batch", False),
    ("bit for bit (slower prompts on CPU)", True),
)
# For models that reason aloud (Qwen3, ...); off goes through the template's own switch.
THINKING_CHOICES = (
    ("on (think before answering)", True),
    ("off (the template's switch)", False),
)
DRAFTER_LABELS = {
    "auto": "auto (measures and picks per round)",
    "model": "draft model",
    "mtp": "the model's own MTP head",
    "eagle3": "the model's EAGLE-3 head",
    "dflash": "the model's DFlash head (a block a forward)",
    "dspark": "the model's DSpark head (DFlash + a Markov head)",
    "ngram": "n-gram (prompt lookup)",
    "none": "off (plain decoding)",
}


class SettingsScreen(ModalScreen[Settings | None]):
    """Edit settings; Ctrl+S or Save validates and dismisses with them, Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "save", "Save settings", priority=True),
        Binding("escape", "cancel", "Cancel"),
    ]

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog settings"):
            yield Label("Settings", classes="title")
            for name, label, hint in NUMBER_FIELDS:
                with Horizontal(classes="field"):
                    yield Label(label, classes="field-label")
                    yield Input(str(getattr(self.settings, name)), id=name)
                    yield Label(hint, classes="hint")
            with Horizontal(classes="field"):
                yield Label("Drafter", classes="field-label")
                yield Select(
                    [(DRAFTER_LABELS[choice], choice) for choice in DRAFTER_CHOICES],
                    value=self.settings.drafter,
                    allow_blank=False,
                    id="drafter",
                )
            with Horizontal(classes="field"):
                yield Label("Exact output", classes="field-label")
                yield Select(
                    EXACT_OUTPUT_CHOICES,
                    value=self.settings.exact_output,
                    allow_blank=False,
                    id="exact_output",
                )
            with Horizontal(classes="field"):
                yield Label("Thinking", classes="field-label")
                yield Select(
                    THINKING_CHOICES,
                    value=self.settings.thinking,
                    allow_blank=False,
                    id="thinking",
                )
            yield Label("System prompt", classes="field-label")
            yield TextArea(self.settings.system_prompt, id="system_prompt")
            yield Label("", id="settings-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save (Ctrl+S)", variant="primary", id="save")
                yield Button("Cancel (Esc)", id="cancel")

    def edited_settings(self) -> Settings:
        """The settings as edited; raises SettingsError naming the first bad field."""
        values: dict[str, object] = {}
        for name, label, _ in NUMBER_FIELDS:
            text = self.query_one(f"#{name}", Input).value.strip()
            kind = type(getattr(self.settings, name))
            try:
                values[name] = kind(text)
            except ValueError:
                raise SettingsError(f"{label} must be a number, not {text!r}") from None
        values["drafter"] = self.query_one("#drafter", Select).value
        values["exact_output"] = self.query_one("#exact_output", Select).value
        values["thinking"] = self.query_one("#thinking", Select).value
        values["system_prompt"] = self.query_one("#system_prompt", TextArea).text
        return dataclasses.replace(self.settings, **values)  # type: ignore[arg-type]

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        """Validate; on success close with the new settings, else say what is wrong."""
        try:
            settings = self.edited_settings()
        except SettingsError as error:
            self.query_one("#settings-error", Label).update(str(error))
            return
        self.dismiss(settings)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        """Close without changing anything."""
        self.dismiss(None)
