"""Rollback on the tiny models, one operation at a time (benchmarks/hybrid_loop_cost.py):
a 5-token forward, dropping 3 of it, and the next 1-token forward, each timed."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.tiny_hybrid_models import CONTEXT, load_tiny_model

MICRO_PROMPT = "The sea is wide and the waves are high, the wind is strong and the night is long"


@dataclass(frozen=True)
class MicroResult:
    """Per-operation times (ms, median and fastest) on one model."""

    model: str
    operation: str
    median_ms: float
    fastest_ms: float
    samples: int
    load: float
    note: str = ""


def micro_rollback(
    label: str, path: Path, snapshots: int | None, threads: int, repeats: int
) -> list[MicroResult]:
    """Forward 5 tokens, drop 3 of them, forward 1: each step timed, ``repeats`` times."""
    model = load_tiny_model(path, threads, snapshots)
    try:
        recurrent = model._recurrent
        checkpoint_times: list[float] = []
        if recurrent is not None:
            copy = recurrent._checkpoint

            def timed_copy() -> Any:
                started = time.perf_counter()
                result = copy()
                checkpoint_times.append(time.perf_counter() - started)
                return result

            recurrent._checkpoint = timed_copy
        words = model.tokenize(MICRO_PROMPT)
        model.prefill(words)
        checkpoint_times.clear()  # the prompt's anchor is not a round's cost
        times: dict[str, list[float]] = {"forward 1": [], "forward 5": [], "drop 3 of 5": []}
        after: list[float] = []
        mode = (
            "KV cut"
            if recurrent is None
            else ("snapshot" if recurrent.snapshots else "checkpoint restore")
        )
        load = os.getloadavg()[0]
        token = 300
        for _ in range(repeats):
            started = time.perf_counter()
            model.forward([token])
            times["forward 1"].append(time.perf_counter() - started)
            base = len(model.cached_tokens)
            batch = [token + offset for offset in range(1, 6)]
            started = time.perf_counter()
            model.forward(batch)
            times["forward 5"].append(time.perf_counter() - started)
            started = time.perf_counter()
            model.rollback(base + 2)
            times["drop 3 of 5"].append(time.perf_counter() - started)
            started = time.perf_counter()
            model.forward([token + 9])
            after.append(time.perf_counter() - started)
            token = 300 + (token + 7) % 50
            if len(model.cached_tokens) > CONTEXT - 16:
                break
        load = max(load, os.getloadavg()[0])
        results = [
            MicroResult(label, name, 1e3 * statistics.median(s), 1e3 * min(s), len(s), load)
            for name, s in (
                ("forward 1", times["forward 1"]),
                ("forward 5", times["forward 5"]),
                (f"drop 3 of the 5 ({mode})", times["drop 3 of 5"]),
                ("next forward 1 after the drop", after),
            )
        ]
        if recurrent is not None and not recurrent.snapshots:
            last = results[-1]
            results[-1] = MicroResult(
                last.model,
                last.operation,
                last.median_ms,
                last.fastest_ms,
                last.samples,
                load,
                "includes replaying the 2 kept tokens (a decode of its own)",
            )
        if checkpoint_times:
            size = copy().payload.nbytes  # one more copy, untimed: its size
            results.append(
                MicroResult(
                    label,
                    "checkpoint copy (inside forward 5)",
                    1e3 * statistics.median(checkpoint_times),
                    1e3 * min(checkpoint_times),
                    len(checkpoint_times),
                    load,
                    f"{size:,} bytes",
                )
            )
        return results
    finally:
        model.close()
