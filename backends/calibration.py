"""Measuring what a forward pass costs on this machine, for this pair.

The numbers decide whether speculation can pay: the time of a target forward of
1, 2, 4 and 8 tokens, and of one draft-model step, taken at a realistic position
in the context. It takes about a second on a 2-core CPU; callers cache the result
(see app/calibration_store.py) so the next start begins calibrated.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from backends.base import Model
from backends.controller import CostModel

CALIBRATION_SIZES = (1, 2, 4, 8)
# A stretch of ordinary text, so the forwards run at a typical position.
_CONTEXT_TEXT = "Measure the cost of a forward pass at a realistic position. " * 6


def time_forward(model: Model, size: int, repeats: int) -> float:
    """Median seconds of a ``size``-token forward from the model's current position."""
    base = len(model.cached_tokens)
    tokens = [model.cached_tokens[-1]] * size
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        model.forward(tokens)
        samples.append(time.perf_counter() - started)
        model.rollback(base)
    return statistics.median(samples)


def measure_costs(
    target: Model,
    draft: Model | None = None,
    *,
    sizes: Sequence[int] = CALIBRATION_SIZES,
    repeats: int = 2,
) -> CostModel:
    """Time target forwards of ``sizes`` tokens and one draft step; caches are left empty."""
    context = target.tokenize(_CONTEXT_TEXT, add_special=False)
    target_seconds: dict[int, float] = {}
    draft_seconds: float | None = None
    for model in (target, draft):
        if model is None:
            continue
        model.rollback(0)
        model.prefill(context)
        time_forward(model, 1, 1)  # warm up
        if model is target:
            for size in sizes:
                target_seconds[size] = time_forward(model, size, repeats)
        else:
            draft_seconds = time_forward(model, 1, repeats)
        model.rollback(0)
    return CostModel(target_seconds, draft_seconds)
