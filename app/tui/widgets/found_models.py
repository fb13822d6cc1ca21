"""The models screen's "on this machine" part: ``draftpen models scan`` in the app.

GGUF files found in the Hugging Face cache, LM Studio's folder and Ollama's store, and
for each target and smaller draft whether they can pair (llama.cpp's vocabulary rule)
or why not, with the ``models add`` command that makes a pair of them.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Label, Static

from app.models.disk import format_bytes
from app.models.sources.on_this_machine import ScanResult

FOUND_COLUMNS = ("#", "Model", "Where", "Kind", "Size")


class FoundModelsView(Vertical):
    """GGUF models already on this machine, and which can pair."""

    DEFAULT_CSS = """
    FoundModelsView {
        height: auto;
        max-height: 14;
        padding: 0 1;
        border-top: tall $panel;
    }
    FoundModelsView #found {
        height: auto;
        max-height: 7;
    }
    FoundModelsView .found-title {
        text-style: bold;
    }
    FoundModelsView #found-pairs {
        color: $text-muted;
    }
    """

    def compose(self) -> ComposeResult:
        yield Label("On this machine (draftpen models scan): looking…", classes="found-title")
        yield DataTable(id="found", cursor_type="row", zebra_stripes=True)
        yield Static("", id="found-pairs", markup=False)

    def on_mount(self) -> None:
        self.query_one("#found", DataTable).add_columns(*FOUND_COLUMNS)

    def show(self, result: ScanResult) -> None:
        """Show a scan's models, its skipped files and its pair verdicts."""
        table = self.query_one("#found", DataTable)
        table.clear()
        for number, model in enumerate(result.models, 1):
            kind = f"{model.header.architecture}, {len(model.header.tokens):,} tokens"
            table.add_row(
                str(number), model.label, model.place, kind, format_bytes(model.size_bytes)
            )
        title = self.query_one(".found-title", Label)
        if result.models:
            title.update(
                f"On this machine (draftpen models scan): {len(result.models)} GGUF model(s)"
            )
        else:
            title.update(
                "On this machine (draftpen models scan): no GGUF models in the Hugging Face "
                "cache, LM Studio's models folder or Ollama's store"
            )
        table.display = bool(result.models)
        lines = result.verdict_lines()
        lines += [f"skipped {path}: {reason}" for path, reason in result.skipped]
        if result.models:
            lines.append("Any target also runs alone (n-gram drafts): draftpen chat --target PATH")
        self.query_one("#found-pairs", Static).update("\n".join(lines))
