"""Cost calibrations kept on disk, one per machine, pair, runtime and settings.

Measuring forward costs takes a few seconds at load on a small CPU; keeping the result means the
next start begins calibrated. The key covers everything that changes the numbers:
the model files, the runtime and its version, threads, GPU offload, the CPU. When
any of them changes the key changes and calibration is simply done again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.machine import cpu_model
from app.settings import cache_dir
from backends.engine import Engine
from backends.speculation.calibration import disturbed
from backends.speculation.cost_audit import CostCorrection
from backends.speculation.cost_model import CostModel

# 2: every batch size to 8, and the exact batch limit; 3: measured past 512 tokens
CALIBRATION_VERSION = 3


def calibration_key(engine: Engine, runtime: str) -> str:
    """A stable name for this engine's cost profile on this machine."""
    parts: dict[str, object] = {
        "version": CALIBRATION_VERSION,
        "runtime": runtime,
        "runtime_version": _runtime_version(runtime),
        "machine": platform.machine(),
        "processor": cpu_model(),
        "cpus": os.cpu_count(),
    }
    for role, model in (("target", engine.target), ("draft", engine.draft)):
        if model is None:
            parts[role] = None
            continue
        path = getattr(model, "path", None)
        parts[role] = {
            "name": model.name,
            "file": Path(path).name if path else None,
            "size": Path(path).stat().st_size if path and Path(path).exists() else None,
            "threads": getattr(model, "n_threads", None),
            "gpu": getattr(model, "gpu_offload", None),
            "exact_kernels": getattr(model, "exact_kernels", None),
        }
        # A target split over workers costs what the network adds: measured apart,
        # per split (a model on this machine alone keeps the key it always had).
        placement = getattr(model, "placement", None)
        if placement not in (None, "this machine"):
            parts[role]["placement"] = placement  # type: ignore[index]
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return digest[:24]


def calibration_path(key: str) -> Path:
    """Where the calibration with this key lives."""
    return cache_dir() / "calibration" / f"{key}.json"


@dataclass(frozen=True)
class StoredCalibration:
    """A calibration file as ``draftpen doctor`` shows it."""

    path: Path
    costs: CostModel
    models: str  # "target + draft", as named when it was taken
    corrected_at: float | None
    correction: str  # the loop's latest correction, in words ("" if none)


def load_costs(key: str) -> CostModel | None:
    """The stored cost model, or None if there is none (or it is unreadable)."""
    stored = read_calibration(calibration_path(key))
    return stored.costs if stored is not None else None


def read_calibration(path: Path) -> StoredCalibration | None:
    """One calibration file, or None if it is missing or damaged."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        target = {int(size): float(seconds) for size, seconds in data["target_seconds"].items()}
        draft = data.get("draft_step_seconds")
        limit = data.get("exact_batch_limit")
        costs = CostModel(
            target,
            float(draft) if draft is not None else None,
            exact_batch_limit=int(limit) if limit is not None else None,
            taken_at=_optional_float(data.get("taken_at")),
            others_cpu_share=_optional_float(data.get("others_cpu_share")),
            one_token_fastest=_optional_float(data.get("one_token_fastest")),
        )
        return StoredCalibration(
            path,
            costs,
            str(data.get("models", "")),
            _optional_float(data.get("corrected_at")),
            str(data.get("correction", "")),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        # Missing or damaged: measuring again is cheap and always right.
        return None


def stored_calibrations() -> list[StoredCalibration]:
    """Every readable calibration on this machine, newest first."""
    folder = cache_dir() / "calibration"
    found = [read_calibration(path) for path in folder.glob("*.json")] if folder.is_dir() else []
    stored = [calibration for calibration in found if calibration is not None]
    return sorted(stored, key=lambda item: -(item.corrected_at or item.costs.taken_at or 0.0))


def save_costs(
    key: str, costs: CostModel, *, models: str = "", correction: CostCorrection | None = None
) -> None:
    """Store a cost model atomically (a crash never leaves half a file)."""
    path = calibration_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, object] = {
        "target_seconds": {str(k): v for k, v in sorted(costs.target_seconds.items())},
        "draft_step_seconds": costs.draft_step_seconds,
        "exact_batch_limit": costs.exact_batch_limit,
        "taken_at": costs.taken_at,
        "others_cpu_share": costs.others_cpu_share,
        "one_token_fastest": costs.one_token_fastest,
        "models": models,
    }
    if correction is not None:
        record["corrected_at"] = time.time()
        record["correction"] = correction.describe()
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_text(json.dumps(record, indent=2), encoding="utf-8")
    os.replace(partial, path)


def keep_corrections(
    costs: CostModel, key: str, models: str, report: Callable[[str], None]
) -> None:
    """Store the curve again whenever the loop corrects it (cost_audit.py), off the
    loop's thread: the next start begins from what this one measured."""

    # Corrections come in bursts (one size, then the next); each write runs on its own
    # thread, so an older snapshot may reach the lock after a newer one: it is skipped,
    # or the file would end up holding figures the loop has already corrected.
    lock = threading.Lock()
    made = 0
    written = 0

    def store(correction: CostCorrection) -> None:
        nonlocal made
        # The figures as they stand now, copied on the loop's thread (it changes them).
        snapshot = costs.copy()
        made += 1
        generation = made

        def write() -> None:
            nonlocal written
            with lock:
                if generation < written:
                    return
                try:
                    save_costs(key, snapshot, models=models, correction=correction)
                    written = generation
                except OSError as error:
                    report(f"could not store the corrected calibration ({error})")

        threading.Thread(target=write, name="calibration-store", daemon=True).start()

    costs.audit.on_correction = store


def ensure_calibrated(
    engine: Engine, runtime: str, report: Callable[[str], None] = lambda message: None
) -> CostModel:
    """Load this engine's cost model from disk, or measure and store it.

    Figures that look taken on a busy machine (``calibration.disturbed``) are not
    stored: they serve for now, held to what the loop measures while it decodes
    (``cost_audit.py``, whose corrections are stored), and the next start measures
    again. Nothing waits for a second measurement: on a busy machine it would take as
    long as the first, and the load is what a user waits on.
    """
    key = calibration_key(engine, runtime)
    models = " + ".join(model.name for model in (engine.target, engine.draft) if model is not None)
    costs = load_costs(key)
    why = disturbed(costs) if costs is not None else None
    if costs is not None and why is not None:
        report(f"the stored calibration looks disturbed ({why}): measuring again")
        costs = None
    if costs is None:
        report("measuring forward costs on this machine")
        costs = engine.calibrate()
        why = disturbed(costs)
        if why is not None:
            report(
                f"the machine looked busy while measuring ({why}): these figures serve for "
                "now, corrected as replies are written, and are measured again next start"
            )
        else:
            try:
                save_costs(key, costs, models=models)
            except OSError as error:
                report(f"could not save the calibration ({error}); it will be measured next time")
    keep_corrections(costs, key, models, report)
    engine.costs = costs
    return costs


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _runtime_version(runtime: str) -> str | None:
    if runtime == "llamacpp":
        try:
            from importlib.metadata import version

            return version("llama-cpp-python")
        except Exception:  # not installed: the key just says so
            return None
    return None
