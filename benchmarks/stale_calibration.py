"""Is `auto` ever slower than plain decoding, whatever its stored figures say? (issue 51)

Loads a pair in this process and runs bench's prompt suite, plain decoding against
`auto`, in three settings:

- ``good``: the figures measured here, now (as a quiet first load stores them);
- ``busy``: the curve a user's first load stored during a compile on the 2-core EPYC
  (T(1) 295 ms where a quiet one costs 45 ms; T(3) 283 ms ...), scaled to this machine
  by the ratio of its measured T(1) to 45 ms;
- ``became-busy``: the good figures, then a process that keeps one CPU busy runs beside
  both modes (the machine became busy after calibrating).

Every `auto` reply starts from the setting's figures afresh, so each one is the first
reply after a load: what `auto` corrects, it corrects within that reply. Ratios are
`auto`'s tokens/s over plain's on the same prompts in the same run (modes alternate).

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        python benchmarks/stale_calibration.py --pair starter --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from app.bench.modes import BenchMode, LocalDecoder, ModeTotals, paired_ratios, run_modes
from app.bench.suite import BenchPrompt, load_prompt_suite
from app.loading import load_engine
from backends.engine import Engine
from backends.sampling.filters import SamplingParams
from backends.speculation.calibration import disturbed, measure_costs
from backends.speculation.cost_model import CostModel

# Issue 51's stored curve (seconds), taken while a build ran; a quiet T(1) there: 45 ms.
BUSY_CURVE = {1: 0.295, 2: 0.428, 3: 0.283, 4: 0.500, 5: 0.808, 8: 1.453, 16: 1.469}
BUSY_DRAFT_STEP = 0.059
QUIET_ONE_TOKEN = 0.045


class FreshFigures(LocalDecoder):
    """Each `auto` generation starts from ``figures`` again (a first reply after a load);
    what it corrected is collected in ``corrections``."""

    def __init__(self, engine: Engine, figures: CostModel) -> None:
        super().__init__(engine)
        self.figures = figures
        self.corrections: list[str] = []

    def decode(
        self, prompt: BenchPrompt, mode: BenchMode, params: SamplingParams, max_tokens: int
    ) -> ModeTotals:
        if mode.drafter != "auto":
            return super().decode(prompt, mode, params, max_tokens)
        costs = self.figures.copy()
        self.engine.costs = costs
        totals = super().decode(prompt, mode, params, max_tokens)
        self.corrections += [correction.describe() for correction in costs.corrections]
        return totals


@contextmanager
def one_cpu_busy(on: bool) -> Iterator[None]:
    """A process spinning on one CPU while the block runs (when ``on``)."""
    if not on:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def main() -> int:
    """Run the three settings and print each category's auto/plain ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--settings", default="good,busy,became-busy")
    parser.add_argument("--json", help="write the figures to this file too")
    args = parser.parse_args()

    engine = load_engine(args.pair, n_ctx=4096, calibrate=False)
    prompts = load_prompt_suite(None)
    prompts = [prompt for prompt in prompts if not prompt.constrained]
    good = measure_costs(engine.target, engine.draft)
    print(
        f"measured here: T(1) {good.target_seconds[1] * 1000:.1f} ms, disturbed: "
        f"{disturbed(good)}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    scale = good.target_seconds[1] / QUIET_ONE_TOKEN
    busy = CostModel(
        {size: seconds * scale for size, seconds in BUSY_CURVE.items()},
        BUSY_DRAFT_STEP * scale,
        exact_batch_limit=good.exact_batch_limit,
    )
    figures = {"good": good, "busy": busy, "became-busy": good}
    modes = [BenchMode("plain", "none", 0), BenchMode("auto", "auto", 0)]
    report: dict[str, dict[str, object]] = {}
    try:
        for setting in args.settings.split(","):
            decoder = FreshFigures(engine, figures[setting])
            with one_cpu_busy(setting == "became-busy"):
                load = os.getloadavg()[0]
                results = run_modes(
                    decoder,
                    prompts,
                    modes,
                    max_tokens=args.max_tokens,
                    repeats=args.repeats,
                    progress=False,
                )
            ratios = {
                category: by_mode["auto"].tokens_per_second / by_mode["plain"].tokens_per_second
                for category, by_mode in results.items()
            }
            report[setting] = {
                "ratios": ratios,
                "paired": {
                    category: paired_ratios(by_mode, "auto")
                    for category, by_mode in results.items()
                },
                "plain_tokens_per_second": {
                    category: by_mode["plain"].tokens_per_second
                    for category, by_mode in results.items()
                },
                "corrections": sorted(set(decoder.corrections)),
                "load_average_at_start": load,
            }
            shown = ", ".join(f"{category} {ratio:.2f}x" for category, ratio in ratios.items())
            print(f"{setting:12} auto/plain: {shown}  (load {load:.2f})", flush=True)
            for correction in sorted(set(decoder.corrections))[:6]:
                print(f"{'':12}   corrected: {correction}")
    finally:
        engine.close()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as output:
            json.dump(report, output, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
