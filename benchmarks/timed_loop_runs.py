"""One generation of benchmarks/hybrid_loop_cost.py: the engine's loop with the target's,
the draft model's and the MTP head's runtime calls timed, and the figures of the run."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.engine import Engine, GenerationRequest
from backends.sampling.filters import SamplingParams
from benchmarks.tiny_hybrid_models import load_tiny_model

SETTINGS = {
    "T0": SamplingParams(temperature=0.0, seed=1),
    "T0.7": SamplingParams(temperature=0.7, top_p=0.95, seed=1),
}


# -- timing the runtime calls ------------------------------------------------------------


@dataclass
class CallTimes:
    """Seconds of each call of one kind, with how many tokens it carried."""

    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def total(self) -> float:
        return sum(self.seconds)

    def median_ms(self, where: Callable[[int], bool] = lambda count: True) -> float | None:
        chosen = [s for s, n in zip(self.seconds, self.tokens, strict=True) if where(n)]
        return 1e3 * statistics.median(chosen) if chosen else None


class Timers:
    """Wraps a model's runtime calls (instance attributes) and records their times."""

    def __init__(self) -> None:
        self.calls: dict[str, CallTimes] = {}

    def wrap(self, owner: Any, method: str, label: str, count: Callable[..., int]) -> None:
        original = getattr(owner, method)
        record = self.calls.setdefault(label, CallTimes())

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = original(*args, **kwargs)
            record.seconds.append(time.perf_counter() - started)
            record.tokens.append(count(*args, **kwargs))
            return result

        setattr(owner, method, timed)

    def reset(self) -> None:
        for record in self.calls.values():
            record.seconds.clear()
            record.tokens.clear()


def _tokens_in(tokens: Any, *args: Any, **kwargs: Any) -> int:
    return len(tokens)


def _one(*args: Any, **kwargs: Any) -> int:
    return 1


def instrument(engine: Engine) -> Timers:
    """Time the target's forwards and rollbacks, its checkpoint copies and restores, the
    draft model's steps, checkpoints and rollbacks, and the MTP head's start and steps."""
    timers = Timers()
    target, draft = engine.target, engine.draft
    timers.wrap(target, "forward", "target forward", _tokens_in)
    timers.wrap(target, "rollback", "target rollback", _one)
    recurrent = getattr(target, "_recurrent", None)
    if recurrent is not None:
        timers.wrap(recurrent, "_checkpoint", "target checkpoint", _one)
        timers.wrap(recurrent, "_restore", "target restore", _one)
    if draft is not None:
        timers.wrap(draft, "forward", "draft forward", _tokens_in)
        timers.wrap(draft, "rollback", "draft rollback", _one)
        timers.wrap(draft, "keep_rollback_point", "draft keep point", _one)
    head = target.mtp_head() if getattr(target, "mtp_layers", 0) else None
    if head is not None:
        timers.wrap(head, "start", "mtp start", _one)
        timers.wrap(head, "step", "mtp step", _one)
    return timers


# -- the loop -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopRun:
    """One generation's figures."""

    target: str
    drafter: str
    setting: str
    generated: int
    host_ms_per_token: float
    host_ms_per_round: float
    tokens_per_second: float
    acceptance: float
    tokens_per_pass: float
    drafted: int
    load: float
    # From the timers (ms; None where there was no such call).
    verify_ms: float | None
    verify_tokens: float | None
    single_forward_ms: float | None
    rollback_ms_per_token: float
    restores: int
    replayed_tokens: int
    checkpoint_ms: float | None
    restore_ms: float | None
    draft_step_ms: float | None
    draft_keep_point_ms: float | None
    draft_rollback_ms_per_token: float | None
    mtp_start_ms: float | None
    mtp_step_ms: float | None
    mtp_ms_per_drafted: float | None


@dataclass(frozen=True)
class Target:
    """A target to generate with, and which drafters it runs."""

    label: str
    path: Path
    draft: Path
    drafters: tuple[str, ...]
    snapshots: int | None = None


def load_engine(target: Target, threads: int) -> Engine:
    return Engine(
        load_tiny_model(target.path, threads, target.snapshots),
        load_tiny_model(target.draft, threads),
    )


def run_loop(
    engine: Engine,
    timers: Timers,
    target: Target,
    drafter: str,
    setting: str,
    prompt: list[int],
    args: argparse.Namespace,
) -> LoopRun:
    """One generation, with the timers' figures for it."""
    timers.reset()
    recurrent = getattr(engine.target, "_recurrent", None)
    restores_before = recurrent.restores if recurrent is not None else 0
    replayed_before = recurrent.replayed_tokens if recurrent is not None else 0
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        params=SETTINGS[setting],
        max_tokens=args.max_tokens,
        drafter=drafter,
        draft_tokens=args.draft_tokens,
    )
    load = os.getloadavg()[0]
    events = list(engine.generate(request))
    load = max(load, os.getloadavg()[0])
    stats = events[-1].stats
    calls = timers.calls
    forwards = calls["target forward"]
    drafted = sum(event.draft_length for event in events if event.drafter == "mtp")
    mtp_seconds = (
        calls["mtp start"].total() + calls["mtp step"].total() if "mtp start" in calls else 0.0
    )
    verifies = [n for n in forwards.tokens if n > 1]

    def median(label: str, where: Callable[[int], bool] = lambda count: True) -> float | None:
        return calls[label].median_ms(where) if label in calls else None

    return LoopRun(
        target=target.label,
        drafter=drafter,
        setting=setting,
        generated=stats.generated_tokens,
        host_ms_per_token=stats.host_ms_per_token,
        host_ms_per_round=1e3 * stats.host_seconds / stats.rounds if stats.rounds else 0.0,
        tokens_per_second=stats.decode_tokens_per_second,
        acceptance=stats.acceptance_rate,
        tokens_per_pass=stats.tokens_per_target_pass,
        drafted=stats.drafted,
        load=load,
        verify_ms=forwards.median_ms(lambda count: count > 1),
        verify_tokens=statistics.median(verifies) if verifies else None,
        single_forward_ms=forwards.median_ms(lambda count: count == 1),
        rollback_ms_per_token=1e3 * calls["target rollback"].total() / stats.generated_tokens,
        restores=(recurrent.restores - restores_before) if recurrent is not None else 0,
        replayed_tokens=(
            (recurrent.replayed_tokens - replayed_before) if recurrent is not None else 0
        ),
        checkpoint_ms=median("target checkpoint"),
        restore_ms=median("target restore"),
        draft_step_ms=median("draft forward", lambda count: count == 1),
        draft_keep_point_ms=median("draft keep point"),
        draft_rollback_ms_per_token=(
            1e3 * calls["draft rollback"].total() / stats.generated_tokens
            if calls.get("draft rollback") and calls["draft rollback"].seconds
            else None
        ),
        mtp_start_ms=median("mtp start"),
        mtp_step_ms=median("mtp step"),
        mtp_ms_per_drafted=1e3 * mtp_seconds / drafted if drafted else None,
    )
