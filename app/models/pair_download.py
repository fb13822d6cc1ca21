"""Download a pair as one unit, with progress events and cancellation, for the TUI and CLI.

:func:`download_pair` runs in a worker thread: it fetches the target and draft of one
runtime variant (skipping verified ones), reports :class:`PullEvent` s (per model and
overall: bytes, speed, ETA) to a callback, stops when a ``threading.Event`` is set, and
finishes with the tokenizer pair check. Cancelling keeps what the hub already sent, so
the next call resumes; the callback runs in the worker thread (a Textual screen posts a
message from it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from app.errors import DownloadCancelledError
from app.models.catalog import Catalog, ModelEntry
from app.models.disk import disk_free_bytes
from app.models.downloads import pull_pair
from app.models.pair_files import ResolvedPair, pair_models, pair_variant
from app.models.source import ModelSource
from app.models.store import ModelStore, ProgressStage
from app.rates import RollingRate
from backends.pair_check import PairCheck, check_pair
from backends.select import load_vocabulary

Role = Literal["target", "draft"]
# Stages that move bytes towards the finished pair; verify and discard do not.
_TRANSFER_STAGES: tuple[ProgressStage, ...] = ("download", "assemble", "convert")
SPEED_WINDOW_SECONDS = 1.0


@dataclass(frozen=True)
class PullEvent:
    """One step of a pair download, as a progress bar needs it."""

    pair: str
    runtime: str
    model_key: str
    role: Role
    stage: ProgressStage
    """verify, download, assemble (PyPI), convert (GGUF to MLX), discard, done."""
    model_done: int
    model_total: int
    """Bytes of this model's current stage (the ``verify`` stage counts bytes hashed)."""
    overall_done: int
    overall_total: int
    """Bytes of the models still to fetch, all together (verified ones are left out)."""
    bytes_per_second: float | None
    """Transfer speed over the last second or so; ``None`` until measured."""
    eta_seconds: float | None
    """Time left for the whole pair at that speed; ``None`` until measured."""


PullEventCallback = Callable[[PullEvent], None]


@dataclass
class _ModelProgress:
    total: int
    done: int = 0
    transferring: bool = False
    finished: bool = False


@dataclass
class PullTracker:
    """Turns the store's per-model progress calls into :class:`PullEvent` s.

    Also the cancellation point: every progress call checks ``cancel`` and raises
    :class:`DownloadCancelledError` when it is set, which unwinds the download.
    """

    pair: str
    runtime: str
    roles: dict[str, Role]
    sizes: dict[str, int]
    on_event: PullEventCallback
    cancel: threading.Event | None = None
    clock: Callable[[], float] = time.monotonic
    _models: dict[str, _ModelProgress] = field(default_factory=dict)
    _speed: float | None = None

    def __post_init__(self) -> None:
        self._rate = RollingRate(SPEED_WINDOW_SECONDS, self.clock)

    def __call__(self, model_key: str, stage: ProgressStage, done: int, total: int) -> None:
        """A :data:`~app.models.store.ProgressCallback`."""
        if self.cancel is not None and self.cancel.is_set():
            raise DownloadCancelledError(
                f"Download of pair {self.pair!r} cancelled; what was downloaded is kept, and "
                f"pulling it again continues from there (draftpen models pull {self.pair})."
            )
        model = self._models.setdefault(model_key, _ModelProgress(self.sizes.get(model_key, 0)))
        if stage in _TRANSFER_STAGES:
            if not model.transferring:
                model.transferring = True
                model.done = 0
            if total > 0:
                model.total = total
            # PyPI downloads then assembles: each stage runs 0..total; keep the bar moving on.
            model.done = max(model.done, min(done, model.total))
        elif stage == "done":
            model.finished = True
            model.done = model.total
        self._measure()
        self.on_event(self._event(model_key, stage, done, total))

    def _counted(self) -> list[_ModelProgress]:
        # A model that was already there reports done without transferring: not counted.
        return [m for m in self._models.values() if m.transferring or not m.finished] + [
            _ModelProgress(size) for key, size in self.sizes.items() if key not in self._models
        ]

    def _overall(self) -> tuple[int, int]:
        counted = self._counted()
        return sum(m.done for m in counted), sum(m.total for m in counted)

    def _measure(self) -> None:
        self._rate.add(self._overall()[0])
        seconds, gained = self._rate.span()
        # Too short a span gives a spike, not a speed: wait for a quarter of the window.
        if seconds >= SPEED_WINDOW_SECONDS / 4 and gained >= 0:
            self._speed = gained / seconds

    def _event(self, model_key: str, stage: ProgressStage, done: int, total: int) -> PullEvent:
        overall_done, overall_total = self._overall()
        eta = None
        if self._speed:
            eta = max(overall_total - overall_done, 0) / self._speed
        return PullEvent(
            pair=self.pair,
            runtime=self.runtime,
            model_key=model_key,
            role=self.roles.get(model_key, "target"),
            stage=stage,
            model_done=done,
            model_total=total,
            overall_done=overall_done,
            overall_total=overall_total,
            bytes_per_second=self._speed,
            eta_seconds=eta,
        )


def download_pair(
    catalog: Catalog,
    pair_name: str,
    store: ModelStore,
    *,
    runtime: str | None = None,
    on_event: PullEventCallback = lambda event: None,
    cancel: threading.Event | None = None,
    sources: Iterable[ModelSource] | None = None,
    free_bytes: Callable[[Path], int] = disk_free_bytes,
    check_tokenizers: bool = True,
) -> ResolvedPair:
    """Fetch a pair variant as one unit, verify it, check its tokenizers; return its paths.

    Raises (all with one-line messages): :class:`DiskSpaceError` before anything is
    fetched when the disks lack room, :class:`DownloadCancelledError` when ``cancel`` was
    set (partial hub downloads are kept for a resume), :class:`DownloadError`,
    :class:`ChecksumMismatchError` (the bad file is deleted), and
    :class:`~backends.errors.IncompatiblePairError` when the tokenizers do not match.
    """
    pair = catalog.pair(pair_name)
    variant = pair_variant(pair, runtime)
    models = catalog.models_of(variant)
    roles: dict[str, Role] = {variant.target: "target"}
    if variant.draft is not None:
        roles[variant.draft] = "draft"
    # Only what still has to come counts towards the overall bar (a cheap look, no hashing;
    # a model found complete after all simply reports done without any bytes).
    to_fetch = models_to_fetch(catalog, pair.key, store, variant.runtime)
    tracker = PullTracker(
        pair=pair.key,
        runtime=variant.runtime,
        roles=roles,
        sizes={model.key: model.size_bytes for model in to_fetch},
        on_event=on_event,
        cancel=cancel,
    )
    resolved = pull_pair(
        catalog, pair.key, store, sources, tracker, free_bytes, runtime=variant.runtime
    )
    if check_tokenizers:
        verdict = check_pair_tokenizers(resolved)
        if verdict is not None:
            target, draft = models[0], models[1]
            verdict.raise_if_incompatible(target.name, draft.name)
    return resolved


def check_pair_tokenizers(resolved: ResolvedPair) -> PairCheck | None:
    """The tokenizer pair check on downloaded files; ``None`` when there is nothing to check.

    Nothing to check: a pair without a draft, or a runtime that cannot read a tokenizer
    alone (mlx: its engine checks the pair when it loads).
    """
    if resolved.draft_path is None:
        return None
    target = load_vocabulary(resolved.target_path, runtime=resolved.runtime)
    if target is None:
        return None
    try:
        draft = load_vocabulary(resolved.draft_path, runtime=resolved.runtime)
        if draft is None:
            return None
        try:
            return check_pair(target, draft)
        finally:
            _close(draft)
    finally:
        _close(target)


def _close(vocabulary: object) -> None:
    close = getattr(vocabulary, "close", None)
    if close is not None:
        close()


def models_to_fetch(
    catalog: Catalog, pair_name: str, store: ModelStore, runtime: str | None
) -> tuple[ModelEntry, ...]:
    """The models of the pair variant that are not downloaded yet (cheap: no hashing)."""
    models = pair_models(catalog, pair_name, runtime)
    return tuple(model for model in models if store.state(model) != "downloaded")
