"""The models screen: every pair with sizes, fit and state; download, cancel, delete, use.

The screen is a client of the engine too: while the app is attached to one, which pairs
can be served and which one is loaded come from the engine (``GET /v1/models``, read in
a thread worker when the screen opens and every few seconds while it shows, so a pair an
agent switched to shows as loaded); the catalog adds the pairs that can be downloaded.
Downloads stay local file work.

The pair recommended for this machine is starred, with the reason above the table; below
it, the GGUF files already on the machine and which of them can pair (``models scan``),
read in a thread worker when the screen opens (S scans again).

Downloads run in a thread worker; its progress events come back as messages and move
one bar per model and one for the whole pair (bytes, speed, time left). Cancelling keeps
what was fetched, and the next download of the pair resumes from there.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label, ProgressBar

from app.client import EngineClient, EngineError
from app.client.wire import PairCard
from app.errors import DownloadCancelledError, DraftpenError
from app.models.disk import format_bytes
from app.models.pair_download import PullEvent
from app.models.sources.on_this_machine import ScanResult
from app.tui.models_service import ModelsService, PairListing
from app.tui.screens.dialogs import ConfirmDialog
from app.tui.widgets.found_models import FoundModelsView
from backends.errors import BackendError

# State first: the description is long and is the column a narrow terminal cuts.
COLUMNS = ("Pair", "State", "Target + draft", "Fits this machine", "Good for")
# How often the open screen asks the engine what it serves (a small local request).
ENGINE_REFRESH_SECONDS = 2.0


def describe_progress(done: int, total: int, speed: float | None, eta: float | None) -> str:
    """``412 MB of 1.1 GB · 23.4 MB/s · 0:31 left``, leaving out what is not known yet."""
    parts = [f"{format_bytes(done)} of {format_bytes(total)}"]
    if speed:
        parts.append(f"{format_bytes(int(speed))}/s")
    if eta is not None and speed:
        minutes, seconds = divmod(int(eta + 0.5), 60)
        parts.append(f"{minutes}:{seconds:02d} left")
    return " · ".join(parts)


class ModelsScreen(Screen[str | None]):
    """Pick, download or delete pairs; dismisses with a pair name to load, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "use_or_download", "Use / download", priority=True),
        Binding("d", "download", "Download"),
        Binding("delete,x", "delete", "Delete files"),
        Binding("escape", "cancel_or_close", "Cancel download / back"),
        Binding("s", "scan", "Scan this machine"),
    ]

    @dataclass
    class Progress(Message):
        """A download made progress."""

        event: PullEvent

    @dataclass
    class Finished(Message):
        """A download ended: ``error`` is None on success, else the message to show."""

        pair: str
        error: str | None
        cancelled: bool = False

    @dataclass
    class Scanned(Message):
        """The scan of this machine's GGUF files finished."""

        result: ScanResult

    @dataclass
    class EngineListed(Message):
        """The engine's pairs (``GET /v1/models``), or why they could not be read."""

        pairs: list[PairCard] | None
        error: str | None = None

    def __init__(
        self,
        service: ModelsService,
        current_pair: str | None,
        engine: EngineClient | None = None,
    ) -> None:
        super().__init__()
        self.service = service
        self.current_pair = current_pair
        # The engine the app is attached to; None: not connected (yet), files only.
        self.engine = engine
        # What the engine serves, as last read (None: not read, or it could not be).
        self.engine_pairs: list[PairCard] | None = None
        self.rows: list[PairListing] = []
        self.downloading: str | None = None
        self.cancel = threading.Event()
        self.last_outcome = ""
        self._bar_for: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label("", id="machine-runtime")
        yield Label("", id="engine-pairs")
        yield Label("", id="recommendation")
        yield DataTable(id="pairs", cursor_type="row", zebra_stripes=True)
        yield FoundModelsView(id="found-models")
        with Vertical(id="download"):
            yield Label("", id="download-title")
            yield Label("", id="target-label")
            yield ProgressBar(id="target-bar", show_eta=False)
            yield Label("", id="draft-label")
            yield ProgressBar(id="draft-bar", show_eta=False)
            yield Label("", id="overall-label")
            yield ProgressBar(id="overall-bar", show_eta=False)
        yield Label("", id="models-outcome")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "draftpen: models"
        self.query_one("#machine-runtime", Label).update(
            f"Runtime on this machine: {self.service.runtime}. Models go to "
            f"{self.service.store.root} (Hugging Face downloads: the HF cache)."
        )
        self.query_one("#pairs", DataTable).add_columns(*COLUMNS)
        self.query_one("#download").display = False
        self._show_engine_note(None)
        self.refresh_rows()
        self.action_scan()
        if self.engine is not None:
            self._read_engine()
            self.set_interval(ENGINE_REFRESH_SECONDS, self._read_engine)

    def on_unmount(self) -> None:
        # Quitting mid-download: stop the worker thread (the partial file is kept).
        self.cancel.set()

    def select_pair(self, pair_name: str) -> None:
        """Move the cursor to ``pair_name``'s row."""
        names = [row.name for row in self.rows]
        if pair_name in names:
            self.query_one("#pairs", DataTable).move_cursor(row=names.index(pair_name))

    @property
    def loaded_pair(self) -> str | None:
        """The pair marked ●: the engine's loaded one, or without an engine the app's."""
        if self.engine_pairs is None:
            return self.current_pair
        return next((card.id for card in self.engine_pairs if card.loaded), None)

    def refresh_rows(self) -> None:
        """Read every pair's state again (the engine's word, as last read, first)."""
        table = self.query_one("#pairs", DataTable)
        cursor = table.cursor_row
        table.clear()
        self.rows = merge_engine_pairs(self.service.rows(), self.engine_pairs)
        loaded = self.loaded_pair
        for row in self.rows:
            marker = "● " if row.name == loaded else "  "
            star = " ★" if row.recommended else ""
            sizes = row.sizes if row.available else ""
            table.add_row(
                marker + row.name + star, row.state, sizes, row.fit, row.description, key=row.name
            )
        best = getattr(self.service, "recommendation", None)
        self.query_one("#recommendation", Label).update(
            f"★ Recommended here: {best.pair}, {best.reason}."
            if best is not None
            else "No pair fits this machine's memory (see the fit column)."
        )
        if self.rows:
            table.move_cursor(row=min(cursor, len(self.rows) - 1))

    # -- the engine ------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="engine-pairs", exit_on_error=False)
    def _read_engine(self) -> None:
        """Ask the engine what it serves and what it holds (in a thread: a socket call)."""
        assert self.engine is not None
        try:
            pairs = self.engine.pairs()
        except EngineError as error:
            self.post_message(self.EngineListed(None, str(error)))
            return
        self.post_message(self.EngineListed(pairs))

    @on(EngineListed)
    def _engine_listed(self, message: EngineListed) -> None:
        changed = message.pairs != self.engine_pairs
        self.engine_pairs = message.pairs
        self._show_engine_note(message.error)
        if changed:  # redraw the table only when the engine's answer changed
            self.refresh_rows()

    def _show_engine_note(self, error: str | None) -> None:
        if self.engine is None:
            text = "No engine attached yet: the list shows the files on this machine."
        elif error is not None:
            text = f"Could not ask the engine ({error}); the list shows this machine's files."
        elif self.engine_pairs is None:
            text = "Asking the engine what it serves…"
        else:
            loaded = self.loaded_pair
            held = f"{loaded} is loaded" if loaded else "no pair is loaded"
            text = (
                f"The engine serves {len(self.engine_pairs)} downloaded pairs; {held} "
                "(● marks it). Enter has it load another."
            )
        self.query_one("#engine-pairs", Label).update(text)

    def _selected(self) -> PairListing | None:
        table = self.query_one("#pairs", DataTable)
        if not self.rows or table.cursor_row < 0:
            return None
        return self.rows[table.cursor_row]

    def _say(self, text: str) -> None:
        self.last_outcome = text
        self.query_one("#models-outcome", Label).update(text)

    # -- actions ------------------------------------------------------------------------

    def action_use_or_download(self) -> None:
        """Load a downloaded pair in the chat, or download one that is not."""
        row = self._selected()
        if row is None:
            return
        if row.usable:
            self.dismiss(row.name)
        else:
            self.action_download()

    def action_download(self) -> None:
        """Download the selected pair (both files, as one unit)."""
        row = self._selected()
        if row is None:
            return
        if self.downloading is not None:
            self._say(f"Already downloading {self.downloading}; Esc cancels it.")
            return
        if not row.available:
            self._say(f"{row.name} has no models for {row.runtime}.")
            return
        if row.usable:
            self._say(f"{row.name} is already downloaded; Enter uses it.")
            return
        self.downloading = row.name
        self.cancel = threading.Event()
        self._show_bars(row)
        self._say(f"Downloading {row.name}… (Esc cancels; a later download resumes)")
        self._download(row.name, self.cancel)

    def action_cancel_or_close(self) -> None:
        """Cancel the running download, or go back to the chat."""
        if self.downloading is not None:
            self.cancel.set()
            self._say(f"Cancelling {self.downloading}…")
        else:
            self.dismiss(None)

    def action_delete(self) -> None:
        """Delete the selected pair's files, after confirmation, and say what was freed."""
        row = self._selected()
        if row is None or not row.available or row.state == "absent":
            return
        if row.name == self.downloading:
            self._say("Cancel the download (Esc) before deleting it.")
            return
        if row.name == self.current_pair:
            self._say(f"{row.name} is loaded in the chat; pick another pair first.")
            return
        if row.state == "loaded":
            self._say(f"{row.name} is loaded in the engine; have it load another pair first.")
            return
        if row.target_bytes == 0:  # a pair only the engine knows: its files are not ours
            self._say(f"{row.name} is not a pair of this machine's catalog; nothing to delete.")
            return

        def delete(confirmed: bool | None) -> None:
            if not confirmed:
                return
            try:
                freed = self.service.remove(row.name)
            except (OSError, DraftpenError) as error:
                self._say(f"Could not delete {row.name}: {error}")
                return
            self._say(f"Deleted {row.name}: freed {format_bytes(freed)}.")
            self.refresh_rows()

        self.app.push_screen(
            ConfirmDialog(f"Delete the files of {row.name} ({row.sizes})?"), delete
        )

    def action_scan(self) -> None:
        """Look for GGUF files on this machine again (in a worker: it reads headers)."""
        self._scan()

    @work(thread=True, exclusive=True, group="scan", exit_on_error=False)
    def _scan(self) -> None:
        try:
            result = self.service.scan()
        except OSError as error:
            self.post_message(self.Scanned(ScanResult((), (), ((Path("."), str(error)),))))
            return
        self.post_message(self.Scanned(result))

    @on(Scanned)
    def _scanned(self, message: Scanned) -> None:
        self.query_one(FoundModelsView).show(message.result)

    # -- the download worker -----------------------------------------------------------

    @work(thread=True, exclusive=True, group="download", exit_on_error=False)
    def _download(self, pair_name: str, cancel: threading.Event) -> None:
        """Run the download (in a thread) and report how it ended."""
        try:
            self.service.download(
                pair_name, lambda event: self.post_message(self.Progress(event)), cancel
            )
        except DownloadCancelledError as error:
            self.post_message(self.Finished(pair_name, str(error), cancelled=True))
        except (DraftpenError, BackendError, OSError) as error:
            self.post_message(self.Finished(pair_name, str(error)))
        else:
            self.post_message(self.Finished(pair_name, None))

    def _show_bars(self, row: PairListing) -> None:
        self.query_one("#download").display = True
        self.query_one("#download-title", Label).update(f"{row.name} ({row.runtime})")
        variant = self.service.variant(row.name)
        self._bar_for = {variant.target: "target"}
        if variant.draft is not None:
            self._bar_for[variant.draft] = "draft"
        for role in ("target", "draft"):
            shown = role in self._bar_for.values()
            self.query_one(f"#{role}-label").display = shown
            self.query_one(f"#{role}-bar").display = shown
            self.query_one(f"#{role}-bar", ProgressBar).update(total=None, progress=0)
            self.query_one(f"#{role}-label", Label).update(f"{role}: waiting")
        self.query_one("#overall-bar", ProgressBar).update(total=None, progress=0)
        self.query_one("#overall-label", Label).update("pair: starting")

    @on(Progress)
    def _progress(self, message: Progress) -> None:
        event = message.event
        role = self._bar_for.get(event.model_key, event.role)
        if event.model_total > 0:
            self.query_one(f"#{role}-bar", ProgressBar).update(
                total=event.model_total, progress=event.model_done
            )
        self.query_one(f"#{role}-label", Label).update(
            f"{role}: {event.model_key} · {event.stage} · "
            + describe_progress(event.model_done, event.model_total, None, None)
        )
        if event.overall_total > 0:
            self.query_one("#overall-bar", ProgressBar).update(
                total=event.overall_total, progress=event.overall_done
            )
        self.query_one("#overall-label", Label).update(
            "pair: "
            + describe_progress(
                event.overall_done, event.overall_total, event.bytes_per_second, event.eta_seconds
            )
        )

    @on(Finished)
    def _finished(self, message: Finished) -> None:
        self.downloading = None
        if message.error is None:
            self._say(f"{message.pair} is downloaded and checked. Enter uses it in the chat.")
        elif message.cancelled:
            self._say(message.error)
        else:
            self._say(f"Download of {message.pair} failed: {message.error}")
        self.refresh_rows()


def merge_engine_pairs(
    rows: list[PairListing], engine_pairs: list[PairCard] | None
) -> list[PairListing]:
    """The catalog's rows with the engine's word on what can be served and what is loaded.

    A pair the engine serves is "downloaded", or "loaded" when it holds it; the others
    keep what this machine's files say (absent, partial: something to download). A pair
    the engine serves that the catalog here does not list is added at the end.
    """
    if engine_pairs is None:
        return rows
    served = {card.id: card for card in engine_pairs}
    merged = [
        replace(row, state="loaded" if served[row.name].loaded else "downloaded")
        if row.name in served
        else row
        for row in rows
    ]
    known = {row.name for row in rows}
    runtime = rows[0].runtime if rows else ""
    for card in engine_pairs:
        if card.id in known:
            continue
        models = f"{card.target} + {card.draft}" if card.draft else f"{card.target} (no draft)"
        merged.append(
            PairListing(
                name=card.id,
                description=f"served by the engine: {models}",
                runtime=runtime,
                target_bytes=0,
                draft_bytes=None,
                fit="",
                fits=True,
                state="loaded" if card.loaded else "downloaded",
            )
        )
    return merged
