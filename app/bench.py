"""``draftpen bench``: does speculation pay on this machine, and by how much?

Everything runs on ONE loaded pair, in alternation (plain, draft model, n-gram for
each prompt in turn), so background noise hits every mode alike. All runs are
greedy, so the modes write the same text and their speeds compare like for like.

Besides end-to-end speed, bench measures the costs that decide the answer: a
target forward of 1, 2, 4, 8 and 16 tokens and one draft step. From them it prints
the *ceiling*: the speedup a free drafter that is always right would reach at each
K, ``(K + 1) * cost(1) / cost(K + 1)``. On a compute-bound CPU that ceiling is low.
"auto" is the adaptive controller the app uses by default.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from app.errors import DraftpenError
from app.machine import machine_description
from backends.base import ChatMessage
from backends.calibration import measure_costs
from backends.controller import CostModel
from backends.engine import Engine, GenerationRequest
from backends.sampling import SamplingParams

FORWARD_SIZES = (1, 2, 4, 8, 16)
COST_REPEATS = 5
CEILING_DRAFT_LENGTHS = (1, 3, 7, 15)


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of the suite."""

    category: str
    text: str


@dataclass(frozen=True)
class BenchMode:
    """One way of decoding that bench compares."""

    label: str
    drafter: str
    draft_tokens: int


@dataclass
class ModeTotals:
    """Summed results of one mode over one category."""

    generated_tokens: int = 0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    speculative_rounds: int = 0
    target_passes: int = 0

    @property
    def tokens_per_second(self) -> float:
        """Decode speed over every run of this mode."""
        return self.generated_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted tokens per drafting round."""
        return self.accepted / self.speculative_rounds if self.speculative_rounds else 0.0


def load_prompt_suite(categories: list[str] | None = None) -> list[BenchPrompt]:
    """The prompt suite shipped with draftpen, optionally only some categories."""
    text = resources.files("app").joinpath("bench_prompts.toml").read_text(encoding="utf-8")
    prompts = [BenchPrompt(p["category"], p["text"]) for p in tomllib.loads(text)["prompts"]]
    if categories:
        known = {p.category for p in prompts}
        unknown = sorted(set(categories) - known)
        if unknown:
            raise DraftpenError(
                f"Unknown bench categories: {', '.join(unknown)}. "
                f"Known: {', '.join(sorted(known))}."
            )
        prompts = [p for p in prompts if p.category in categories]
    return prompts


def run_modes(
    engine: Engine,
    prompts: list[BenchPrompt],
    modes: list[BenchMode],
    *,
    max_tokens: int,
    repeats: int,
    progress: bool = True,
) -> dict[str, dict[str, ModeTotals]]:
    """Run every mode on every prompt, alternating modes prompt by prompt."""
    results: dict[str, dict[str, ModeTotals]] = {}
    params = SamplingParams(temperature=0.0)
    for repeat in range(repeats):
        for prompt in prompts:
            tokens = tuple(engine.chat_prompt([ChatMessage("user", prompt.text)]))
            for mode in modes:
                request = GenerationRequest(
                    prompt_tokens=tokens,
                    params=params,
                    max_tokens=max_tokens,
                    drafter=mode.drafter,
                    draft_tokens=mode.draft_tokens,
                )
                last = None
                for event in engine.generate(request):
                    last = event
                assert last is not None
                stats = last.stats
                totals = results.setdefault(prompt.category, {}).setdefault(
                    mode.label, ModeTotals()
                )
                totals.generated_tokens += stats.generated_tokens
                totals.decode_seconds += stats.decode_seconds
                totals.drafted += stats.drafted
                totals.accepted += stats.accepted
                totals.speculative_rounds += stats.speculative_rounds
                totals.target_passes += stats.target_passes
                if progress:
                    print(
                        f"  [{repeat + 1}/{repeats}] {prompt.category:<9} {mode.label:<14} "
                        f"{stats.decode_tokens_per_second:6.1f} tok/s  "
                        f"accepted {stats.accepted}/{stats.drafted}",
                        file=sys.stderr,
                    )
    return results


def format_report(
    results: dict[str, dict[str, ModeTotals]],
    modes: list[BenchMode],
    costs: CostModel,
) -> str:
    """The human-readable report."""
    lines = ["", f"Measured costs on this machine (median of {COST_REPEATS}):"]
    forward = ", ".join(f"{n}: {s * 1000:.1f} ms" for n, s in costs.target_seconds.items())
    lines.append(f"  target forward of n tokens  {forward}")
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
    lines.append("")
    plain = modes[0].label
    header = f"{'category':<10} {plain + ' tok/s':>12}"
    for mode in modes[1:]:
        header += f" | {mode.label:>14} tok/s  ratio  accept  mean len"
    lines.append(header)
    overall: dict[str, ModeTotals] = {}
    for category, by_mode in results.items():
        base = by_mode[plain].tokens_per_second
        row = f"{category:<10} {base:>12.1f}"
        for mode in modes[1:]:
            totals = by_mode[mode.label]
            ratio = totals.tokens_per_second / base if base else 0.0
            row += (
                f" | {totals.tokens_per_second:>20.1f} {ratio:5.2f}x"
                f" {totals.acceptance_rate:6.0%} {totals.mean_accepted_length:9.2f}"
            )
        lines.append(row)
        for label, totals in by_mode.items():
            merged = overall.setdefault(label, ModeTotals())
            for name in ("generated_tokens", "decode_seconds", "drafted", "accepted"):
                setattr(merged, name, getattr(merged, name) + getattr(totals, name))
            merged.speculative_rounds += totals.speculative_rounds
    lines.append("")
    base = overall[plain].tokens_per_second
    for mode in modes[1:]:
        ratio = overall[mode.label].tokens_per_second / base if base else 0.0
        verdict = "pays" if ratio >= 1.05 else ("breaks even" if ratio >= 0.97 else "does not pay")
        lines.append(
            f"{mode.label}: {ratio:.2f}x plain decoding over all categories: "
            f"speculation {verdict} on this machine."
        )
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace) -> int:
    """Entry point of ``draftpen bench``."""
    from app.loading import load_engine
    from app.settings import load_settings

    settings = load_settings()
    pair = args.pair or settings.default_pair
    prompts = load_prompt_suite(args.category or None)
    print(f"draftpen bench: loading {pair} ...", file=sys.stderr)
    engine = load_engine(
        pair,
        n_ctx=args.context or settings.context_length,
        runtime=args.runtime,
        calibrate=False,  # bench measures the costs itself, more thoroughly
    )
    try:
        k = args.draft_tokens
        modes = [BenchMode("plain", "none", 0)]
        if engine.draft is not None:
            modes.append(BenchMode(f"draft K={k}", "model", k))
        modes.append(BenchMode(f"n-gram K={k}", "ngram", k))
        modes.append(BenchMode("auto", "auto", k))
        print("measuring forward costs ...", file=sys.stderr)
        costs = measure_costs(
            engine.target, engine.draft, sizes=FORWARD_SIZES, repeats=COST_REPEATS
        )
        engine.costs = CostModel(dict(costs.target_seconds), costs.draft_step_seconds)
        print(f"running {len(prompts)} prompts x {len(modes)} modes ...", file=sys.stderr)
        results = run_modes(
            engine, prompts, modes, max_tokens=args.max_tokens, repeats=args.repeats
        )
    finally:
        engine.close()
    report = {
        "pair": pair,
        "machine": machine_description(),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "costs_ms": {
            "target_forward": {n: s * 1000 for n, s in costs.target_seconds.items()},
            "draft_step": (costs.draft_step_seconds or 0.0) * 1000,
        },
        "ceilings": {k: costs.ceiling(k) for k in CEILING_DRAFT_LENGTHS},
        "results": {
            category: {
                label: {
                    **asdict(totals),
                    "tokens_per_second": totals.tokens_per_second,
                    "ratio_to_plain": totals.tokens_per_second / by_mode["plain"].tokens_per_second,
                    "acceptance_rate": totals.acceptance_rate,
                    "mean_accepted_length": totals.mean_accepted_length,
                }
                for label, totals in by_mode.items()
            }
            for category, by_mode in results.items()
        },
    }
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_report(results, modes, costs))
    return 0
