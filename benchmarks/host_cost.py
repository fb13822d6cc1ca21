"""The loop's host time per generated token, by mode and sampling setting (a benchmark).

Runs ``draftpen generate --json`` on a real pair for each mode (plain decoding, the
draft model at K=4, ``auto``) and sampling setting (temperature 0; temperature 0.7 with
top_p 0.95 and top_k 0, an OpenAI client's defaults; the chat app's defaults,
top_k 40, top_p 0.95, min_p 0.05) and reads ``host_ms_per_token`` from its
statistics: decode time outside the target's and draft's forward and rollback
calls, per token. With several ``--tree`` checkouts it runs each cell once per tree
in turn, rotating which goes first, so before and after are taken in one run on
the same machine:

    git archive main | tar -x -C /tmp/before
    python benchmarks/host_cost.py --tree /tmp/before --tree . --repeats 3

Each tree's own ``app`` and ``backends`` are imported (the command runs in that
directory with it first on ``PYTHONPATH``); the installed dependencies are shared.
The load average is printed beside each figure: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# temperature, top_p, top_k, min_p
SETTINGS = {
    "T0": ("0", "1", "0", "0"),
    "T0.7 top_p .95": ("0.7", "0.95", "0", "0"),
    "chat defaults": ("0.7", "0.95", "40", "0.05"),
}
MODES = {
    "plain": ["--drafter", "none"],
    "draft model K=4": ["--drafter", "model", "--draft-tokens", "4"],
    # The default: the controller picks the drafter and K each round (it calibrates
    # first, outside the decode time).
    "auto": ["--drafter", "auto"],
}
PROMPT = "Write a Python function that reverses a list, and explain how it works."
LAUNCH = "import sys; from app.main import main; sys.exit(main())"


@dataclass(frozen=True)
class Run:
    """One generation's figures."""

    host_ms_per_token: float
    tokens_per_second: float
    acceptance: float
    load: float


def load_average() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]


def sampling_flags(setting: str) -> list[str]:
    """``generate``'s sampling options for a named setting."""
    temperature, top_p, top_k, min_p = SETTINGS[setting]
    return ["--temperature", temperature, "--top-p", top_p, "--top-k", top_k, "--min-p", min_p]


def run_once(tree: Path, args: argparse.Namespace, mode: str, setting: str) -> Run:
    """One ``generate --json`` in ``tree``; its statistics."""
    command = [
        sys.executable,
        "-c",
        LAUNCH,
        "generate",
        "--pair",
        args.pair,
        "--max-tokens",
        str(args.max_tokens),
        "--seed",
        "1",
        "--json",
        "--prompt",
        args.prompt,
        *MODES[mode],
        *sampling_flags(setting),
    ]
    environment = dict(os.environ, PYTHONPATH=str(tree))
    load = load_average()
    finished = subprocess.run(
        command, cwd=tree, env=environment, capture_output=True, text=True, check=False
    )
    if finished.returncode != 0:
        raise SystemExit(f"generate failed in {tree}:\n{finished.stderr}")
    stats = json.loads(finished.stdout)["stats"]
    return Run(
        host_ms_per_token=float(stats["host_ms_per_token"]),
        tokens_per_second=float(stats["decode_tokens_per_second"]),
        acceptance=float(stats["acceptance_rate"]),
        load=max(load, load_average()),
    )


def main() -> None:
    """Run every cell for every tree and print medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout (repeatable)")
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in (args.tree or [Path(".")])]
    modes = [mode for mode in args.modes.split(",") if mode]
    settings = [setting for setting in args.settings.split(",") if setting]
    for name in modes:
        if name not in MODES:
            raise SystemExit(f"unknown mode {name!r}; choose from {', '.join(MODES)}")
    for name in settings:
        if name not in SETTINGS:
            raise SystemExit(f"unknown setting {name!r}; choose from {', '.join(SETTINGS)}")

    runs: dict[tuple[str, str, Path], list[Run]] = {}
    for repeat in range(args.repeats):
        for mode in modes:
            for setting in settings:
                shift = repeat % len(trees)
                for tree in trees[shift:] + trees[:shift]:
                    run = run_once(tree, args, mode, setting)
                    runs.setdefault((mode, setting, tree), []).append(run)
                    print(
                        f"# {tree.name or tree}: {mode}, {setting}: host "
                        f"{run.host_ms_per_token:.3f} ms/token, {run.tokens_per_second:.1f} "
                        f"tok/s, load {run.load:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )

    print(
        f"host ms per generated token, median (and fastest) of {args.repeats} ({args.pair}, "
        f"{args.max_tokens} tokens); tok/s; load average during the runs"
    )
    print(f"{'mode':<17} {'setting':<15} " + " ".join(f"{tree!s:>56}" for tree in trees))
    for mode in modes:
        for setting in settings:
            cells = []
            for tree in trees:
                done = runs[(mode, setting, tree)]
                hosts = [run.host_ms_per_token for run in done]
                speed = statistics.median(run.tokens_per_second for run in done)
                loads = [run.load for run in done]
                # Others' work on a shared machine only adds time: the fastest run is
                # the nearest to the loop's own cost, the median what a run sees.
                cells.append(
                    f"{statistics.median(hosts):6.3f} ms (min {min(hosts):.3f}) "
                    f"{speed:5.1f} tok/s load {min(loads):.1f}-{max(loads):.1f}"
                )
            print(f"{mode:<17} {setting:<15} " + " ".join(f"{cell:>56}" for cell in cells))


if __name__ == "__main__":
    main()
