"""The loop's sampling work per generated token at temperature > 0, without a model
(a benchmark, not a test).

Drives the real functions a round calls after its forward (``verify_round`` for the
target's rows, ``draft_chain`` for a draft model's) on 151,936-token float32 rows, at
``benchmarks/host_cost.py``'s sampling settings, for plain decoding (one row a token)
and a draft-model round at K=4 (the draft's four rows, the target's five, rejection
sampling), and prints milliseconds per generated token. Only those calls are timed:
building the rows is not.

Rows (``--rows``): ``starter`` is shaped like the starter pair's (a tail of std 2.5,
the top token 24-32 above it, a runner-up 0-13 below: nuclei of 1-4 tokens at T0.7);
``mixed`` puts a few favoured tokens 4-30 above the tail, so a top_p 0.95 nucleus is
sometimes one token and sometimes thousands; ``flat`` favours tokens only 8-16 above a
tail of std 2 (nuclei in the hundreds to tens of thousands). A draft row is its
target row with its top tokens moved by noise, and a third of the time another token
on top, so drafts are accepted about as often as a real draft model's.

``--evict`` writes a 64 MiB buffer between rounds, as a CPU decode streams weights
through the caches: rows and code then come cold (an upper bound; a GPU's logits
arrive by DMA). ``--tree`` runs the same measurement on several checkouts, each in a
child process with that tree first on ``PYTHONPATH``, alternating, so before and after
come from one run:

    git archive main | tar -x -C /tmp/before
    python benchmarks/sampling_round_cost.py --tree /tmp/before --tree . --repeats 3

``--profile`` prints cProfile's top functions for one cell instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np

N_VOCAB = 151_936
K = 4
POOL = 48  # distinct target rows per shape, reused
# temperature, top_p, top_k, min_p (host_cost.py's sampled settings)
SETTINGS = {
    "T0.7 top_p .95": (0.7, 0.95, 0, 0.0),
    "chat defaults": (0.7, 0.95, 40, 0.05),
}
MODES = ("plain", "draft K=4")
SHAPES = ("starter", "mixed", "flat")


class _Target:
    """What ``verify_round`` asks of the target besides its rows."""

    def is_end_of_generation(self, token: int) -> bool:
        """No token ends the reply here."""
        return False


def target_rows(shape: str, count: int, seed: int) -> np.ndarray:
    """``count`` target rows of one shape."""
    rng = np.random.default_rng(seed)
    rows = np.empty((count, N_VOCAB), dtype=np.float32)
    for index in range(count):
        row = rows[index]
        row[:] = rng.standard_normal(N_VOCAB, dtype=np.float32) * (2.0 if shape == "flat" else 2.5)
        tokens = rng.choice(N_VOCAB, size=6, replace=False)
        if shape == "starter":
            top = rng.uniform(24.0, 32.0)
            row[tokens[0]] = top
            row[tokens[1:]] = top - rng.uniform(0.0, 13.0) - 2.0 * np.arange(5)
        elif shape == "mixed":
            row[tokens] = rng.uniform(4.0, 30.0) - rng.uniform(0.0, 6.0, size=6)
        else:
            row[tokens] += 8.0 + 8.0 * rng.random(6) - 3.0 * np.arange(6)
    return rows


def draft_row(target: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A draft model's row for the same position: the target's, its top tokens moved."""
    row = target.copy()
    top = np.argpartition(row, N_VOCAB - 6)[N_VOCAB - 6 :]
    row[top] += rng.normal(0.0, 1.5, size=top.size).astype(np.float32)
    if rng.random() < 1 / 3:
        other = int(rng.integers(N_VOCAB))
        row[other] = row[top].max() + rng.uniform(0.0, 3.0)
    return row


def measure(shape: str, setting: str, mode: str, rounds: int, evict: bool, seed: int) -> float:
    """Milliseconds of sampling work per generated token for one cell."""
    from backends.base import Model
    from backends.sampling.filters import SamplingParams
    from backends.sampling.rows import HostRows
    from backends.speculation.draft_chain import draft_chain
    from backends.speculation.proposal import EMPTY_PROPOSAL
    from backends.speculation.round_sampling import RoundSampling
    from backends.speculation.verification import verify_round

    temperature, top_p, top_k, min_p = SETTINGS[setting]
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p)
    sampling = RoundSampling(params, np.random.default_rng(seed))
    pool = target_rows(shape, POOL, seed)
    rng = np.random.default_rng(seed + 1)
    drafts_pool = [draft_row(row, rng) for row in pool[: POOL // 2]]
    target = cast(Model, _Target())
    sweep = np.zeros(64 << 18, dtype=np.float32) if evict else None  # 64 MiB
    block = np.empty((K + 1, N_VOCAB), dtype=np.float32)
    draft_steps = [np.empty((1, N_VOCAB), dtype=np.float32) for _ in range(K)]
    seconds = 0.0
    tokens = 0
    for round_index in range(rounds):
        start = (round_index * 7) % (POOL - K)
        block[:] = pool[start : start + K + 1]
        if mode != "plain":
            for position in range(K):
                draft_steps[position][0] = drafts_pool[(start + position) % len(drafts_pool)]
                if position % 2 == 0:
                    # Half the positions: the draft is the target's row exactly.
                    draft_steps[position][0] = block[position]
        if sweep is not None:
            np.add(sweep, 1.0, out=sweep)
        started = time.perf_counter()
        if mode == "plain":
            verified = verify_round(target, HostRows(block[:1]), [], EMPTY_PROPOSAL, sampling, None)
        else:
            steps = iter(draft_steps[1:])

            def step(token: int, steps: Iterator[np.ndarray] = steps) -> HostRows:
                return HostRows(next(steps))

            chain = draft_chain(
                HostRows(draft_steps[0]),
                step,
                max_tokens=K,
                params=params,
                rng=sampling.rng,
                constraint=None,
                penalties=None,
                min_confidence=0.0,
                record_confidence=False,
                is_end=target.is_end_of_generation,
            )
            proposal = chain.proposal(params, [], 0.0, passes=1)
            verified = verify_round(target, HostRows(block), chain.tokens, proposal, sampling, None)
        seconds += time.perf_counter() - started
        tokens += len(verified.emitted)
    return 1000.0 * seconds / tokens


def run_cells(args: argparse.Namespace) -> dict[str, float]:
    """Every cell once in this process."""
    results = {}
    for shape in args.shapes:
        for setting in args.settings:
            for mode in args.modes:
                key = f"{shape}|{setting}|{mode}"
                results[key] = measure(shape, setting, mode, args.rounds, args.evict, args.seed)
    return results


def profile(args: argparse.Namespace) -> None:
    """cProfile's view of the first requested cell."""
    import cProfile
    import pstats

    shape, setting, mode = args.shapes[0], args.settings[0], args.modes[0]
    profiler = cProfile.Profile()
    profiler.runcall(measure, shape, setting, mode, args.rounds, args.evict, args.seed)
    pstats.Stats(profiler).sort_stats("cumtime").print_stats("backends", 30)


def child_command(tree: Path, args: argparse.Namespace) -> list[str]:
    """This script, run once in ``tree``'s context, answering in JSON."""
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--json",
        "--rounds",
        str(args.rounds),
        "--seed",
        str(args.seed),
        "--shapes",
        ",".join(args.shapes),
        "--settings",
        ",".join(args.settings),
        "--modes",
        ",".join(args.modes),
        *(["--evict"] if args.evict else []),
    ]


def compare_trees(args: argparse.Namespace) -> None:
    """Each tree in turn, ``--repeats`` times, rotating which goes first; medians."""
    trees = [tree.resolve() for tree in args.tree]
    runs: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    for repeat in range(args.repeats):
        shift = repeat % len(trees)
        for tree in trees[shift:] + trees[:shift]:
            environment = dict(os.environ, PYTHONPATH=str(tree))
            done = subprocess.run(
                child_command(tree, args),
                cwd=tree,
                env=environment,
                capture_output=True,
                text=True,
                check=True,
            )
            runs[tree].append(json.loads(done.stdout))
    print(
        f"sampling work, ms per generated token, median (min) of {args.repeats}; "
        f"{args.rounds} rounds a cell; caches {'evicted' if args.evict else 'warm'}; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'rows':<8} {'setting':<15} {'mode':<10} " + " ".join(f"{t.name:>18}" for t in trees))
    for key in runs[trees[0]][0]:
        shape, setting, mode = key.split("|")
        cells = []
        for tree in trees:
            figures = [run[key] for run in runs[tree]]
            cells.append(f"{statistics.median(figures):7.3f} ({min(figures):.3f})")
        print(f"{shape:<8} {setting:<15} {mode:<10} " + " ".join(f"{c:>18}" for c in cells))


def main() -> None:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=96)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    parser.add_argument("--evict", action="store_true", help="cold caches each round")
    parser.add_argument("--profile", action="store_true", help="cProfile the first cell")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.shapes = [name for name in args.shapes.split(",") if name]
    args.settings = [name for name in args.settings.split(",") if name]
    args.modes = [name for name in args.modes.split(",") if name]
    checks: list[tuple[list[str], tuple[str, ...]]] = [
        (args.shapes, SHAPES),
        (args.settings, tuple(SETTINGS)),
        (args.modes, MODES),
    ]
    for chosen, known in checks:
        for name in chosen:
            if name not in known:
                raise SystemExit(f"unknown {name!r}; choose from {', '.join(known)}")
    if args.profile:
        profile(args)
    elif args.tree:
        compare_trees(args)
    elif args.json:
        print(json.dumps(run_cells(args)))
    else:
        results = run_cells(args)
        for key, value in results.items():
            print(f"{key.replace('|', '  '):<45} {value:7.3f} ms/token")


if __name__ == "__main__":
    main()
