"""What ``draftpen doctor`` says of the cost curves `auto` decides with.

Each pair loaded here has one (app/calibration_store.py): the forward costs measured
at its first load, when they were taken, how busy the machine was then, and what the
loop corrected since (backends/speculation/cost_audit.py). A curve taken on a busy
machine makes `auto` choose wrongly; this is where a user sees it.
"""

from __future__ import annotations

import time
from typing import Any

from app.calibration_store import StoredCalibration
from backends.speculation.calibration import disturbed

SHOWN_SIZES = (1, 2, 3, 4, 8, 16)


def calibration_lines(stored: tuple[StoredCalibration, ...]) -> list[str]:
    """Lines for each stored curve, newest first; one line when there is none."""
    if not stored:
        return ["auto's costs: none measured yet (a pair's first load measures them)"]
    lines = ["auto's costs (per pair loaded here):"]
    for calibration in stored:
        costs = calibration.costs
        forwards = ", ".join(
            f"{size}: {costs.target_seconds[size] * 1000:.0f}"
            for size in SHOWN_SIZES
            if size in costs.target_seconds
        )
        draft = (
            f", draft step {costs.draft_step_seconds * 1000:.1f} ms"
            if costs.draft_step_seconds is not None
            else ""
        )
        lines.append(f"  {calibration.models or calibration.path.stem}:")
        lines.append(f"    forward of n tokens (ms) {forwards}{draft}")
        lines.append(f"    taken {_when(costs.taken_at)}{_busy(calibration)}")
        if calibration.correction:
            lines.append(
                f"    corrected by the loop {_when(calibration.corrected_at)}: "
                f"{calibration.correction}"
            )
        why = disturbed(costs)
        if why is not None:
            lines.append(f"    looks disturbed ({why}): measured again at the next load")
    lines.append(f"  stored in {stored[0].path.parent}; delete a file to measure again")
    return lines


def calibrations_json(stored: tuple[StoredCalibration, ...]) -> list[dict[str, Any]]:
    """The same as data (``doctor --json``)."""
    return [
        {
            "models": calibration.models,
            "file": str(calibration.path),
            "target_forward_ms": {
                size: seconds * 1000
                for size, seconds in sorted(calibration.costs.target_seconds.items())
            },
            "draft_step_ms": None
            if calibration.costs.draft_step_seconds is None
            else calibration.costs.draft_step_seconds * 1000,
            "taken_at": calibration.costs.taken_at,
            "others_cpu_share": calibration.costs.others_cpu_share,
            "corrected_at": calibration.corrected_at,
            "correction": calibration.correction or None,
            "disturbed": disturbed(calibration.costs),
        }
        for calibration in stored
    ]


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "at an unknown time (stored before draftpen kept it)"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def _busy(calibration: StoredCalibration) -> str:
    share = calibration.costs.others_cpu_share
    if share is None:
        return ""
    return f", other processes using {share:.0%} of the CPUs meanwhile"
