"""What every phase of benchmarks/device_measure.py shares: its figures as they come
(printed, and the JSON file rewritten each time), their medians, the deadline, the order."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WARM_UP_TOKENS = 8


def past_deadline() -> bool:
    deadline = os.environ.get("DP_MEASURE_DEADLINE", "").strip()
    return bool(deadline) and time.time() > float(deadline)


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


class Results:
    """A phase's figures: printed as they come, and the JSON file rewritten each time."""

    def __init__(self, phase: str, path: Path | None, meta: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"phase": phase, "meta": meta, "runs": [], "summary": {}}

    def run(self, **fields: Any) -> None:
        self.data["runs"].append(fields)
        shown = {k: v for k, v in fields.items() if k != "tokens"}
        print("  " + json.dumps(shown), flush=True)
        self.save()

    def save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps(self.data, indent=1) + "\n")

    def select(self, **match: Any) -> list[dict[str, Any]]:
        return [r for r in self.data["runs"] if all(r.get(k) == v for k, v in match.items())]


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def text(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
