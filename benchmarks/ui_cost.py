"""What the chat app's UI costs decoding: its decode rate against the same generation headless.

Alternates a headless generation with the real chat app (Textual, headless, driven by
its pilot) writing the same reply with Markdown and with draft colours. Greedy, fixed
prompt and length, so every run writes the same text; the rate is the loop's own
decode rate (prefill excluded), as the app stores it. Ratios are taken within the run,
against the mean headless rate, because this machine's speed drifts. Every app run
writes its reply in a new chat of a new history, so its prompt is the headless one
(the prompt tokens of every run are printed to show it): an app that reopened the last
chat would decode each run after a longer conversation, slower for that reason alone.

Besides the rate, each app run reports the UI's CPU while the reply was decoded (from
the first token to the last, so the final render after it is not counted) and how late
the app's event loop woke while decoding (a task that sleeps 50 ms at a time records
how much longer it took): what a key press such as Esc waits before it is handled.

Two set-ups, chosen by what the tree's chat app is:
- a client of the engine (now): a real ``draftpen serve`` process holds the pair; the
  headless runs are a plain ``EngineClient`` stream drained in a thread, no UI;
- in-process (before issue 18): the pair is loaded into this process; the headless
  runs drain ``Engine.generate`` in a thread, as the app's worker did.

    python benchmarks/ui_cost.py --pair starter --max-tokens 128 --repeats 3

``--tree PATH`` runs another checkout's ``app``/``backends`` (e.g. ``git archive`` of
an older commit), so before and after can be measured in one session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # this script's own modules; --tree's app goes first on the path

from benchmarks.chat_app_run import AppRun, run_in_app  # noqa: E402
from benchmarks.chat_app_setups import Runner, engine_process, in_process_engine  # noqa: E402

MODES = ("headless", "app markdown", "app tints")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--drafter", default="none", help="none (plain decoding), auto, ...")
    parser.add_argument("--tree", type=Path, help="import app/backends from this checkout")
    parser.add_argument("--json", type=Path, help="also write the runs here")
    parser.add_argument(
        "--ui-priority",
        choices=("app", "none", "nice19", "idle"),
        default="app",
        help="how the app lowers its priority while a reply streams: as the tree does "
        "(app), not at all, to nice 19, or to SCHED_IDLE (Linux), to weigh the choice",
    )
    parser.add_argument(
        "--same-chat",
        action="store_true",
        help="every app run continues the last chat (how this script measured before "
        "2026-11-24: each run's prompt is longer than the last)",
    )
    return parser.parse_args()


def main() -> int:
    """Run the comparison and print a table of rates and ratios."""
    args = _parse()
    tree = (args.tree or Path(__file__).resolve().parent.parent).resolve()
    sys.path.insert(0, str(tree))
    # History and settings of these runs stay out of the user's own.
    os.environ["DRAFTPEN_HOME"] = tempfile.mkdtemp(prefix="draftpen-ui-cost-")

    from app.tui.app import DraftpenApp

    _override_priority(args.ui_priority)
    in_process = "engine_loader" in inspect.signature(DraftpenApp).parameters
    print(f"tree: {tree} ({'in-process' if in_process else 'engine client'})", file=sys.stderr)
    with in_process_engine(args) if in_process else engine_process(args, tree) as runner:
        runs = _alternate(runner, args)
    _report(runs, args, tree, "in-process" if in_process else "engine client")
    return 0


def _override_priority(policy: str) -> None:
    """Make the app's LowerPriority apply ``policy`` instead of its own (benchmark only)."""
    if policy == "app":
        return
    from app.tui import priority

    def lower(self: Any) -> None:
        for tid in (int(tid) for tid in os.listdir("/proc/self/task")):
            with contextlib.suppress(OSError):
                self._original.setdefault(tid, os.getpriority(os.PRIO_PROCESS, tid))
                if policy == "nice19":
                    os.setpriority(os.PRIO_PROCESS, tid, 19)
                elif policy == "idle":
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))

    def restore(self: Any) -> None:
        for tid, niceness in list(self._original.items()):
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, tid, niceness)

    priority.LowerPriority.lower = lower  # type: ignore[method-assign]
    priority.LowerPriority.restore = restore  # type: ignore[method-assign]


def _alternate(runner: Runner, args: argparse.Namespace) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    runner.headless()  # warm-up: first-call costs stay out of the figures
    for repeat in range(args.repeats):
        order = MODES[repeat % 3 :] + MODES[: repeat % 3]
        for mode in order:
            niceness = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            load = os.getloadavg()[0]
            idle_before = _cpu_idle()
            if mode == "headless":
                rate, tokens, prompt_tokens = runner.headless()
                ui = AppRun.empty()
            else:
                tints = mode == "app tints"
                ui = asyncio.run(run_in_app(runner, args, tints=tints))
                rate, tokens, prompt_tokens = ui.rate, ui.tokens, ui.prompt_tokens
            runs.append(
                {
                    "repeat": repeat,
                    "mode": mode,
                    "tok_s": rate,
                    "tokens": tokens,
                    "prompt_tokens": prompt_tokens,
                    "load_1min": load,
                    # The machine's idle CPU share over the run (prefill and all): room
                    # a UI at the lowest priority could draw in without taking any.
                    "machine_idle_share": _idle_share(idle_before, _cpu_idle()),
                    "ui_cpu_share": ui.share,
                    "ui_cpu_ms_per_token": ui.per_token * 1000,
                    "ui_cpu_share_decoding": ui.share_decoding,
                    "ui_cpu_ms_per_token_decoding": ui.per_token_decoding * 1000,
                    "loop_late_ms_p50": ui.late_p50 * 1000,
                    "loop_late_ms_max": ui.late_max * 1000,
                    "ui_niceness_before": niceness,
                }
            )
            print(
                f"  {repeat} {mode:13s} {rate:6.2f} tok/s ({tokens} tokens, prompt "
                f"{prompt_tokens}) UI CPU {ui.share:.1%}, {ui.per_token * 1000:.1f} ms/token; "
                f"while decoding {ui.share_decoding:.1%}, "
                f"{ui.per_token_decoding * 1000:.1f} ms/token; loop late "
                f"{ui.late_p50 * 1000:.0f}/{ui.late_max * 1000:.0f} ms (median/max); "
                f"load {load:.2f}; machine idle {runs[-1]['machine_idle_share']:.1%}",
                file=sys.stderr,
            )
    return runs


def _cpu_idle() -> tuple[float, float]:
    """(idle, total) jiffies of all CPUs since boot, from /proc/stat (zeros elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            values = [float(value) for value in stat.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    return values[3] + values[4], sum(values)  # idle + iowait


def _idle_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def _report(runs: list[dict[str, Any]], args: argparse.Namespace, tree: Path, setup: str) -> None:
    headless = statistics.mean(run["tok_s"] for run in runs if run["mode"] == "headless")
    loads = [run["load_1min"] for run in runs]
    print(
        f"\nUI cost ({setup}), pair {args.pair}, drafter {args.drafter}, {args.max_tokens} "
        f"tokens, {args.repeats} repeats, tree {tree}, UI priority {args.ui_priority}, "
        "load average (1 min) "
        f"{min(loads):.2f}-{max(loads):.2f}"
    )
    print(
        f"{'mode':14s} {'mean tok/s':>10s} {'vs headless':>11s} {'UI CPU':>7s} "
        f"{'UI ms/tok':>9s} {'decoding':>8s} {'ms/tok':>6s} {'late ms':>9s} {'idle':>5s}  runs"
    )
    summary = {}
    for mode in MODES:
        mine = [run for run in runs if run["mode"] == mode]
        rates = [run["tok_s"] for run in mine]
        mean = statistics.mean(rates)
        figures = {
            key: statistics.mean(run[key] for run in mine)
            for key in (
                "ui_cpu_share",
                "ui_cpu_ms_per_token",
                "ui_cpu_share_decoding",
                "ui_cpu_ms_per_token_decoding",
                "loop_late_ms_p50",
                "machine_idle_share",
            )
        }
        late_max = max(run["loop_late_ms_max"] for run in mine)
        summary[mode] = {
            "mean_tok_s": mean,
            "ratio": mean / headless,
            **figures,
            "loop_late_ms_max": late_max,
            "runs": rates,
            "prompt_tokens": sorted({run["prompt_tokens"] for run in mine}),
        }
        listed = " ".join(f"{rate:.2f}" for rate in rates)
        late = f"{figures['loop_late_ms_p50']:.0f}/{late_max:.0f}"
        print(
            f"{mode:14s} {mean:10.2f} {mean / headless:10.2f}x {figures['ui_cpu_share']:7.1%} "
            f"{figures['ui_cpu_ms_per_token']:9.1f} {figures['ui_cpu_share_decoding']:8.1%} "
            f"{figures['ui_cpu_ms_per_token_decoding']:6.1f} {late:>9s} "
            f"{figures['machine_idle_share']:5.0%}  {listed}"
        )
    prompts = sorted({run["prompt_tokens"] for run in runs})
    print(f"prompt tokens of every run: {prompts} (one value: every run read the same prompt)")
    if args.json:
        document = {"setup": setup, "tree": str(tree), "runs": runs, "summary": summary}
        args.json.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    sys.exit(main())
