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
import dataclasses
import json
import statistics
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from app.errors import DraftpenError
from app.machine import machine_description
from backends.base import ChatMessage
from backends.calibration import measure_costs
from backends.controller import AcceptanceEstimate, ConfidenceFloor, CostModel
from backends.engine import Engine, GenerationRequest
from backends.sampling import SamplingParams
from backends.speculative import speedup_over_plain_rounds

FORWARD_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16)
COST_REPEATS = 3
CEILING_DRAFT_LENGTHS = (1, 2, 3, 6, 7, 15)
# llama-cpp-python's LlamaPromptLookupDecoding proposes 10 tokens; match it.
NGRAM_DRAFT_TOKENS = 10
WARM_UP_TOKENS = 16
# What bench sums from a generation's statistics, besides tokens and seconds.
COUNTED_STATS = (
    "drafted",
    "accepted",
    "speculative_rounds",
    "target_passes",
    "plain_rounds",
    "plain_round_seconds",
)
# A mode's own draft-free rounds make a baseline only when there are this many.
MIN_OWN_PLAIN_ROUNDS = 16


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
    exact: bool = False
    acceptance_memory: dict[str, AcceptanceEstimate] = field(default_factory=dict, compare=False)
    confidence_floor: ConfidenceFloor = field(default_factory=ConfidenceFloor, compare=False)


@dataclass
class ModeTotals:
    """Summed results of one mode over one category (or one run), and each run's speed."""

    generated_tokens: int = 0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    speculative_rounds: int = 0
    target_passes: int = 0
    plain_rounds: int = 0
    plain_round_seconds: float = 0.0
    run_rates: list[float] = field(default_factory=list)  # tok/s per run, in run order

    @classmethod
    def of_run(cls, generated_tokens: int, decode_seconds: float, **counts: Any) -> ModeTotals:
        """The results of a single run (``counts``: any of the other summed fields)."""
        rate = generated_tokens / decode_seconds if decode_seconds else 0.0
        return cls(generated_tokens, decode_seconds, run_rates=[rate], **counts)

    def add(self, other: ModeTotals) -> None:
        """Count in more runs: sums add up, run speeds are appended."""
        for name in (f.name for f in dataclasses.fields(self) if f.name != "run_rates"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.run_rates.extend(other.run_rates)

    @property
    def tokens_per_second(self) -> float:
        """Decode speed over every run of this mode."""
        return self.generated_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def speedup_over_own_plain_rounds(self) -> float | None:
        """Speed over this mode's own draft-free rounds (None: too few to judge by).

        Those rounds are plain decoding timed within the same runs, so drift of the
        machine's speed between runs cancels out of this ratio.
        """
        if self.plain_rounds < MIN_OWN_PLAIN_ROUNDS:
            return None
        return speedup_over_plain_rounds(
            self.generated_tokens, self.decode_seconds, self.plain_rounds, self.plain_round_seconds
        )

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted tokens per drafting round."""
        return self.accepted / self.speculative_rounds if self.speculative_rounds else 0.0


# What ``--modes`` can pick; plain decoding, the baseline, always runs.
MODE_CHOICES = ("draft", "ngram", "auto", "reference")


def parse_mode_choice(text: str | None) -> set[str]:
    """``--modes draft,auto`` -> the chosen groups (None: all of them)."""
    if not text:
        return set(MODE_CHOICES)
    chosen = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(chosen - set(MODE_CHOICES) - {"plain"})
    if unknown:
        raise DraftpenError(
            f"Unknown bench modes: {', '.join(unknown)}. Choose from {', '.join(MODE_CHOICES)} "
            "(plain decoding always runs)."
        )
    return chosen


def bench_modes(chosen: set[str], *, has_draft: bool, exact: bool) -> list[BenchMode]:
    """The modes to compare: plain first, then the chosen groups that apply to this pair."""
    modes = [BenchMode("plain", "none", 0)]
    if "draft" in chosen and has_draft:
        modes += [BenchMode(f"draft model K={k}", "model", k) for k in (2, 4)]
    if "ngram" in chosen:
        modes.append(BenchMode(f"n-gram K={NGRAM_DRAFT_TOKENS}", "ngram", NGRAM_DRAFT_TOKENS))
    if "auto" in chosen:
        modes.append(BenchMode("auto", "auto", 0))
        if exact:
            modes.append(BenchMode("auto, exact", "auto", 0, exact=True))
    return modes


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
    yardsticks: Sequence[Yardstick] = (),
    progress: bool = True,
) -> dict[str, dict[str, ModeTotals]]:
    """Run every mode on every prompt, alternating modes prompt by prompt.

    The order of the modes rotates by one from run to run (a run: one prompt in one
    repeat), so over the runs each mode takes every place in the order as often as
    the others: a mode is not favoured by always following the same one, or by
    always coming first after a prompt is read.
    """
    results: dict[str, dict[str, ModeTotals]] = {}
    params = SamplingParams(temperature=0.0)
    _warm_up(engine, prompts[0], modes, yardsticks, params)
    runners: list[BenchMode | Yardstick] = [*modes, *yardsticks]
    run = 0
    for repeat in range(repeats):
        for prompt in prompts:
            tokens = tuple(engine.chat_prompt([ChatMessage("user", prompt.text)]))
            by_mode = results.setdefault(prompt.category, {})
            shift = run % len(runners)
            for runner in runners[shift:] + runners[:shift]:
                if isinstance(runner, BenchMode):
                    label, sample = (
                        runner.label,
                        _run_mode(engine, runner, tokens, params, max_tokens),
                    )
                else:
                    label, sample = runner.name, _run_yardstick(runner, tokens, max_tokens)
                totals = by_mode.setdefault(label, ModeTotals())
                totals.add(sample)
                _progress(progress, repeat, repeats, prompt, label, totals, sample)
            run += 1
    return results


def paired_ratios(by_mode: dict[str, ModeTotals], label: str) -> list[float]:
    """Per run, this mode's speed over plain decoding's on the same prompt and repeat."""
    plain = by_mode["plain"].run_rates
    return [rate / base for rate, base in zip(by_mode[label].run_rates, plain, strict=True) if base]


def _run_mode(
    engine: Engine,
    mode: BenchMode,
    tokens: tuple[int, ...],
    params: SamplingParams,
    max_tokens: int,
) -> ModeTotals:
    """One generation in ``mode``; what it measured.

    Each "auto" mode keeps its own acceptance memory across prompts, as a chat session
    does across replies, so no mode profits from what another learned on the same text.
    """
    if mode.drafter == "auto":
        engine.use_acceptance_memory(mode.acceptance_memory, mode.confidence_floor)
    request = GenerationRequest(
        prompt_tokens=tokens,
        params=params,
        max_tokens=max_tokens,
        drafter=mode.drafter,
        draft_tokens=mode.draft_tokens,
        exact=mode.exact,
    )
    last = None
    for event in engine.generate(request):
        last = event
    assert last is not None
    stats = last.stats
    counts = {name: getattr(stats, name) for name in COUNTED_STATS}
    return ModeTotals.of_run(stats.generated_tokens, stats.decode_seconds, **counts)


def _run_yardstick(yardstick: Yardstick, tokens: tuple[int, ...], max_tokens: int) -> ModeTotals:
    count, seconds = yardstick.decode_speed(tokens, max_tokens)
    return ModeTotals.of_run(count, seconds)


def _warm_up(
    engine: Engine,
    prompt: BenchPrompt,
    modes: list[BenchMode],
    yardsticks: Sequence[Yardstick],
    params: SamplingParams,
) -> None:
    """One short, untimed run of every mode: pages the weights in, warms caches."""
    tokens = tuple(engine.chat_prompt([ChatMessage("user", prompt.text)]))
    for mode in modes:
        _run_mode(engine, mode, tokens, params, WARM_UP_TOKENS)
    for yardstick in yardsticks:
        yardstick.decode_speed(tokens, WARM_UP_TOKENS)


def _progress(
    enabled: bool,
    repeat: int,
    repeats: int,
    prompt: BenchPrompt,
    label: str,
    totals: ModeTotals,
    sample: ModeTotals,
) -> None:
    if not enabled:
        return
    detail = f"accepted {sample.accepted}/{sample.drafted}" if sample.drafted else ""
    print(
        f"  [{repeat + 1}/{repeats}] {prompt.category:<9} {label:<32} "
        f"{totals.tokens_per_second:6.1f} tok/s so far  {detail}",
        file=sys.stderr,
    )


def projected_speedup(totals: ModeTotals, draft_size_ratio: float, drafter: str) -> float | None:
    """Speedup on a memory-bound machine (GPU, Apple Silicon) from acceptance measured here.

    There a verify of K + 1 tokens costs about one target step and a draft-model step
    about (draft bytes / target bytes) of one; n-gram drafts cost nothing. Greedy
    acceptance does not depend on the hardware, so tokens per target pass carry over.
    """
    if not totals.target_passes or drafter in ("none", "yardstick"):
        return None
    tokens_per_pass = totals.generated_tokens / totals.target_passes
    drafted_per_pass = totals.drafted / totals.target_passes
    draft_cost = draft_size_ratio if drafter in ("model", "auto") else 0.0
    return tokens_per_pass / (1.0 + drafted_per_pass * draft_cost)


def format_report(
    results: dict[str, dict[str, ModeTotals]],
    labels: list[str],
    costs: CostModel,
    projections: dict[str, dict[str, float | None]],
) -> str:
    """The human-readable report."""
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
    overall: dict[str, ModeTotals] = {}
    for category, by_mode in results.items():
        base = by_mode["plain"].tokens_per_second
        lines += [
            "",
            f"{category}",
            f"  {'mode':<32} {'tok/s':>7} {'vs plain':>9} {'per run**':>11}"
            f" {'vs own***':>10} {'accepted':>9} {'mean len':>9} {'projected*':>11}",
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
                f" {own:>10} {accepted:>9} {mean:>9} {projected:>11}"
            )
            overall.setdefault(label, ModeTotals()).add(totals)
    lines += [
        "",
        "* projected: the speedup on a memory-bound machine (GPU, Apple Silicon), from the",
        "  acceptance measured here and a cost model in which a verify of K+1 tokens costs",
        "  one target step and a draft step costs (draft bytes / target bytes) of one.",
        "  A projection, not a measurement.",
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
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace) -> int:
    """Entry point of ``draftpen bench``."""
    from app.loading import load_engine
    from app.settings import load_settings

    settings = load_settings()
    pair = args.pair or settings.default_pair
    prompts = load_prompt_suite(args.category or None)
    chosen = parse_mode_choice(args.modes)
    print(f"draftpen bench: loading {pair} ...", file=sys.stderr)
    n_ctx = args.context or settings.context_length
    exact_kernels = settings.exact_output if args.exact is None else args.exact
    engine = load_engine(
        pair, n_ctx=n_ctx, runtime=args.runtime, calibrate=False, exact_output=exact_kernels
    )
    yardsticks: list[Yardstick] = []
    try:
        modes = bench_modes(chosen, has_draft=engine.draft is not None, exact=exact_kernels)
        if "reference" in chosen and not args.no_yardsticks:
            yardsticks = _load_yardsticks(engine, n_ctx)
        print("measuring forward costs ...", file=sys.stderr)
        costs = measure_costs(
            engine.target, engine.draft, sizes=FORWARD_SIZES, repeats=COST_REPEATS
        )
        # auto refines the engine's costs as it runs; the report keeps what was measured.
        engine.costs = dataclasses.replace(costs, target_seconds=dict(costs.target_seconds))
        print(
            f"running {len(prompts)} prompts x {len(modes) + len(yardsticks)} modes ...",
            file=sys.stderr,
        )
        results = run_modes(
            engine,
            prompts,
            modes,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            yardsticks=yardsticks,
        )
        size_ratio = _draft_size_ratio(engine)
    finally:
        for yardstick in yardsticks:
            yardstick.close()
        engine.close()
    labels = [mode.label for mode in modes] + [y.name for y in yardsticks]
    drafter_of = {mode.label: mode.drafter for mode in modes}
    projections = {
        category: {
            label: projected_speedup(totals, size_ratio, drafter_of.get(label, "yardstick"))
            for label, totals in by_mode.items()
        }
        for category, by_mode in results.items()
    }
    report = {
        "pair": pair,
        "machine": machine_description(),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "costs_ms": {
            "target_forward": {n: s * 1000 for n, s in costs.target_seconds.items()},
            "draft_step": (costs.draft_step_seconds or 0.0) * 1000,
        },
        "exact_batch_limit": costs.exact_batch_limit,
        "ceilings": {k: costs.ceiling(k) for k in CEILING_DRAFT_LENGTHS},
        "draft_size_ratio": size_ratio,
        "results": {
            category: {
                label: {
                    **asdict(totals),
                    "tokens_per_second": totals.tokens_per_second,
                    "ratio_to_plain": totals.tokens_per_second / by_mode["plain"].tokens_per_second,
                    "paired_ratios": paired_ratios(by_mode, label),
                    "speedup_over_own_plain_rounds": totals.speedup_over_own_plain_rounds,
                    "acceptance_rate": totals.acceptance_rate,
                    "mean_accepted_length": totals.mean_accepted_length,
                    "projected_memory_bound_speedup": projections[category][label],
                }
                for label, totals in by_mode.items()
            }
            for category, by_mode in results.items()
        },
    }
    text = format_report(results, labels, costs, projections)
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        output.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(text)
    return 0


class Yardstick(Protocol):
    """An outside implementation bench compares against."""

    name: str

    def decode_speed(self, prompt_tokens: Sequence[int], max_tokens: int) -> tuple[int, float]:
        """Greedy-decode; return (tokens, seconds) measured after the first token."""
        ...

    def close(self) -> None:
        """Free it."""
        ...


def _load_yardsticks(engine: Engine, n_ctx: int) -> list[Yardstick]:
    path = getattr(engine.target, "path", None)
    if path is None or path.suffix != ".gguf":
        return []  # the yardsticks are llama.cpp's, and read GGUF files only
    try:
        from backends.llamacpp import LlamaCppReference
    except ImportError:
        return []
    print("loading llama-cpp-python's own decoders as yardsticks ...", file=sys.stderr)
    return [
        LlamaCppReference(path, n_ctx=min(n_ctx, 2048)),
        LlamaCppReference(path, n_ctx=min(n_ctx, 2048), prompt_lookup=True),
    ]


def _draft_size_ratio(engine: Engine) -> float:
    target_size = getattr(engine.target, "size_bytes", 0)
    draft_size = getattr(engine.draft, "size_bytes", 0) if engine.draft is not None else 0
    return draft_size / target_size if target_size else 0.0
