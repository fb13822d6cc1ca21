"""Bench's report: costs, ceilings, each mode against plain, and the memory-bound projection."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from app.bench.modes import MIN_OWN_PLAIN_ROUNDS, ModeTotals, paired_ratios
from backends.speculation.cost_audit import COSTS_NOTE_PREFIX
from backends.speculation.cost_model import CostModel

COST_REPEATS = 3


CEILING_DRAFT_LENGTHS = (1, 2, 3, 6, 7, 15)


# The target step of the projection: a 7B target decoding a token on a GPU.
PROJECTION_STEP_SECONDS = 0.0075


def projected_speedup(
    totals: ModeTotals,
    plain: ModeTotals,
    draft_size_ratio: float,
    drafter: str,
    step_seconds: float = PROJECTION_STEP_SECONDS,
) -> float | None:
    """Speedup on a memory-bound machine (GPU, Apple Silicon) from what was measured here.

    There a verify of K + 1 tokens costs about one target step (``step_seconds``) and a
    draft-model step about (draft bytes / target bytes) of one; n-gram drafts cost
    nothing. Greedy acceptance does not depend on the hardware, so tokens per target
    pass carry over; so does the loop's own host time per pass (measured here, where
    the CPU is likely slower than a GPU machine's), which is paid on top of each step.
    """
    if not totals.target_passes or drafter in ("none", "yardstick"):
        return None
    tokens_per_pass = totals.generated_tokens / totals.target_passes
    drafted_per_pass = totals.drafted / totals.target_passes
    draft_cost = draft_size_ratio if drafter in ("model", "auto") else 0.0
    host_per_pass = totals.host_seconds / totals.target_passes
    plain_token = step_seconds + plain.host_ms_per_token / 1000
    pass_seconds = step_seconds * (1.0 + drafted_per_pass * draft_cost) + host_per_pass
    return tokens_per_pass * plain_token / pass_seconds


def format_report(
    results: dict[str, dict[str, ModeTotals]],
    labels: list[str],
    costs: CostModel | None,
    projections: dict[str, dict[str, float | None]],
    *,
    where: dict[str, Any] | None = None,
    corrections: Sequence[str] = (),
) -> str:
    """The human-readable report; ``costs`` None: measured through the engine (``where``).
    ``corrections``: what `auto` re-measured in those costs as it ran, in words."""
    lines = ["", _engine_heading(where or {})] if costs is None else _cost_lines(costs)
    lines += [f"  {COSTS_NOTE_PREFIX}{correction}" for correction in corrections]
    lines += _mode_lines(results, labels, projections)
    return "\n".join(lines)


def _engine_heading(where: dict[str, Any]) -> str:
    kernels = "exact" if where.get("exact_kernels") else "fastest"
    return (
        f"Through the engine (pid {where.get('pid')}, version {where.get('version')}, "
        f"context {where.get('context_length')}, {kernels} kernels):\n"
        "  each figure is the engine's loop as its clients see it. Forward costs and\n"
        "  ceilings need the pair in this process: bench without --engine measures them."
    )


def _cost_lines(costs: CostModel) -> list[str]:
    """What the forward passes cost here, the ceilings, what a draft step costs."""
    lines = ["", f"Measured costs on this machine (median of {COST_REPEATS}):"]
    forward = ", ".join(f"{n}: {s * 1000:.0f}" for n, s in costs.target_seconds.items())
    lines.append(f"  target forward of n tokens (ms)  {forward}")
    if costs.exact_batch_limit == 1:
        lines.append(
            "  no batch of 2 or more gives logits bit-identical to one-token decoding (past "
            "512 tokens of context) with these kernels; bench --exact loads exact ones"
        )
    elif costs.exact_batch_limit is not None:
        lines.append(
            f"  forwards of up to {costs.exact_batch_limit} tokens give logits bit-identical "
            "to one-token decoding (past 512 tokens of context); 'auto, exact' verifies "
            "within that, auto does not"
        )
    if costs.draft_step_seconds is not None:
        lines.append(f"  draft step                  {costs.draft_step_seconds * 1000:.1f} ms")
    ceilings = [f"K={k}: {costs.ceiling(k):.2f}x" for k in CEILING_DRAFT_LENGTHS]
    lines.append(f"  ceiling (free, always-right drafter)  {', '.join(ceilings)}")
    if costs.draft_step_seconds is not None:
        ratio = costs.draft_step_seconds / costs.verify(1)
        lines.append(
            f"  a draft step costs {ratio:.2f} of a target step"
            + ("  -> a draft model cannot pay here" if ratio > 0.5 else "")
        )
    return lines


def _mode_lines(
    results: dict[str, dict[str, ModeTotals]],
    labels: list[str],
    projections: dict[str, dict[str, float | None]],
) -> list[str]:
    """Each category's table of modes, the footnotes, and each mode's verdict."""
    lines: list[str] = []
    overall: dict[str, ModeTotals] = {}
    for category, by_mode in results.items():
        base = by_mode["plain"].tokens_per_second
        lines += [
            "",
            f"{category}",
            f"  {'mode':<32} {'tok/s':>7} {'vs plain':>9} {'per run**':>11}"
            f" {'vs own***':>10} {'accepted':>9} {'mean len':>9} {'host ms':>8}"
            f" {'projected*':>11}",
        ]
        for label in labels:
            totals = by_mode.get(label)
            if totals is None:
                continue
            ratio = totals.tokens_per_second / base if base else 0.0
            accepted = f"{totals.acceptance_rate:.0%}" if totals.drafted else "-"
            mean = f"{totals.mean_accepted_length:.2f}" if totals.drafted else "-"
            projection = projections.get(category, {}).get(label)
            projected = f"{projection:.2f}x" if projection is not None else "-"
            runs = paired_ratios(by_mode, label)
            spread = f"{min(runs):.2f}-{max(runs):.2f}" if len(runs) > 1 else "-"
            own_ratio = totals.speedup_over_own_plain_rounds if label != "plain" else None
            own = f"{own_ratio:.2f}x" if own_ratio is not None else "-"
            lines.append(
                f"  {label:<32} {totals.tokens_per_second:7.1f} {ratio:8.2f}x {spread:>11}"
                f" {own:>10} {accepted:>9} {mean:>9} {totals.host_ms_per_token:8.2f}"
                f" {projected:>11}"
            )
            overall.setdefault(label, ModeTotals()).add(totals)
        forced = [
            f"{label} {totals.grammar_forced / totals.generated_tokens:.0%}"
            for label, totals in by_mode.items()
            if totals.grammar_forced and totals.generated_tokens
        ]
        if forced:
            lines.append(f"  tokens the grammar forced (free drafts): {', '.join(forced)}")
    lines += [
        "",
        "* projected: the speedup on a memory-bound machine (GPU, Apple Silicon), from the",
        "  acceptance measured here and a cost model in which a verify of K+1 tokens costs",
        f"  one target step ({PROJECTION_STEP_SECONDS * 1000:.1f} ms, a 7B target on a GPU), a "
        "draft step (draft bytes / target",
        "  bytes) of one, and the loop's host time per token measured here ('host ms') is",
        "  paid on top. A projection, not a measurement.",
        "** per run: the lowest and highest of this mode's speed over plain decoding's on",
        "  the same prompt in the same repeat: how far single runs scatter on this machine.",
        "*** vs own: its speed over that of its own draft-free (one-token) rounds, timed",
        f"  in the same runs (shown from {MIN_OWN_PLAIN_ROUNDS} such rounds): unmoved by drift",
        "  between runs, but it assumes such a round costs what one of plain decoding does.",
        "",
    ]
    base = overall["plain"].tokens_per_second
    for label in labels[1:]:
        if label not in overall:
            continue
        ratio = overall[label].tokens_per_second / base if base else 0.0
        verdict = "pays" if ratio >= 1.05 else ("breaks even" if ratio >= 0.97 else "does not pay")
        worst_ratio, worst_category = min(
            (by_mode[label].tokens_per_second / by_mode["plain"].tokens_per_second, category)
            for category, by_mode in results.items()
            if label in by_mode and by_mode["plain"].tokens_per_second
        )
        runs = [
            r
            for by_mode in results.values()
            if label in by_mode
            for r in paired_ratios(by_mode, label)
        ]
        lines.append(
            f"{label}: {ratio:.2f}x plain over all categories ({verdict} here); "
            f"worst {worst_ratio:.2f}x ({worst_category}); "
            f"median run {statistics.median(runs):.2f}x of {len(runs)}."
        )
    return lines
