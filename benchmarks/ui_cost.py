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
import dataclasses
import inspect
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROMPT = (
    "Explain how a hash map works in a few short paragraphs, then show a small Python "
    "class implementing one with separate chaining."
)
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
    with _in_process_engine(args) if in_process else _engine_process(args, tree) as runner:
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


class Runner:
    """How one set-up writes the reply headless, and how it builds the app."""

    in_process = False

    def headless(self) -> tuple[float, int, int]:
        """The reply with no UI: (decode tok/s, tokens, prompt tokens)."""
        raise NotImplementedError

    def app(self, settings: Any) -> Any:
        """The chat app wired to this set-up's engine."""
        raise NotImplementedError


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
                ui = asyncio.run(_in_app(runner, args, tints=tints))
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


_SHARED_HISTORY: list[Path] = []


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


def _fresh_history() -> Any:
    """A new, empty chat history: the app opens no earlier chat, so its prompt is PROMPT.

    With ``--same-chat`` every run shares one history, and the app reopens its last chat.
    """
    from app.chats.history import History

    if _SHARED_HISTORY:
        return History(_SHARED_HISTORY[0])
    path = Path(tempfile.mkdtemp(prefix="dp-ui-history-")) / "history.sqlite3"
    if "--same-chat" in sys.argv:
        _SHARED_HISTORY.append(path)
    return History(path)


@contextlib.contextmanager
def _in_process_engine(args: argparse.Namespace) -> Iterator[Runner]:
    from app.loading import load_engine
    from app.tui.app import DraftpenApp
    from backends.engine import Engine

    loaded = load_engine(
        args.pair, n_ctx=args.context, calibrate=args.drafter == "auto", on_progress=print
    )

    class KeptEngine(Engine):
        """The loaded models, kept open when an app run ends (it closes its engine)."""

        def close(self) -> None:
            pass

    engine = KeptEngine(loaded.target, loaded.draft, costs=loaded.costs)

    class InProcess(Runner):
        in_process = True

        def headless(self) -> tuple[float, int, int]:
            request = _request(engine, args)
            last: list[Any] = []

            def drain() -> None:
                for event in engine.generate(request):
                    last[:] = [event]

            thread = threading.Thread(target=drain)
            thread.start()
            thread.join()
            stats = last[0].stats
            return stats.decode_tokens_per_second, stats.generated_tokens, stats.prompt_tokens

        def app(self, settings: Any) -> Any:
            return DraftpenApp(
                engine_loader=lambda name, settings, progress: engine,
                history=_fresh_history(),
                settings=settings,
                pair_name=args.pair,
            )

    try:
        yield InProcess()
    finally:
        loaded.close()


@contextlib.contextmanager
def _engine_process(args: argparse.Namespace, tree: Path) -> Iterator[Runner]:
    import app.client
    from app.client import ChatTurn, EngineClient, find_engine
    from app.tui.app import DraftpenApp
    from backends.base import ChatMessage
    from backends.generation_events import GenerationEvent

    # A tree from before CancelFlag (2026-11-23) takes a plain Event.
    new_cancel_flag = getattr(app.client, "CancelFlag", threading.Event)

    socket_path = Path(tempfile.mkdtemp(prefix="dp-ui-")) / "engine.sock"
    command = [
        sys.executable, "-m", "app.main", "serve", "--socket", str(socket_path),
        "--keep-alive", "-1", "--context", str(args.context),
    ]  # fmt: skip
    engine = subprocess.Popen(command, cwd=tree, stderr=subprocess.DEVNULL)
    try:
        client = None
        for _ in range(1200):  # the engine answers once it listens
            client = find_engine(socket_path) if socket_path.exists() else None
            if client is not None or engine.poll() is not None:
                break
            time.sleep(0.1)
        if client is None:
            raise SystemExit(f"the engine did not start: {' '.join(command)}")
        client.load(args.pair, on_progress=print, context_length=args.context)
        settings = _settings(args)
        turn = ChatTurn(
            pair=args.pair,
            messages=(ChatMessage("user", PROMPT),),
            params=settings.sampling_params(),
            max_tokens=settings.max_tokens,
            drafter=settings.drafter,
            draft_tokens=settings.draft_tokens,
        )

        class Client(Runner):
            def headless(self) -> tuple[float, int, int]:
                last: list[Any] = []

                def drain() -> None:
                    for item in client.chat(turn, new_cancel_flag()):
                        if isinstance(item, GenerationEvent):
                            last[:] = [item]

                thread = threading.Thread(target=drain)
                thread.start()
                thread.join()
                stats = last[0].stats
                return stats.decode_tokens_per_second, stats.generated_tokens, stats.prompt_tokens

            def app(self, settings: Any) -> Any:
                return DraftpenApp(
                    connect=lambda settings, status: EngineClient(socket_path),
                    history=_fresh_history(),
                    settings=settings,
                    pair_name=args.pair,
                )

        yield Client()
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.wait(60)


def _request(engine: Any, args: argparse.Namespace) -> Any:
    from app.settings import Settings
    from backends.base import ChatMessage
    from backends.engine import GenerationRequest

    settings = _settings(args)
    messages = [ChatMessage("user", PROMPT)]
    if settings.system_prompt.strip():
        messages.insert(0, ChatMessage("system", settings.system_prompt))
    assert isinstance(settings, Settings)
    return GenerationRequest(
        prompt_tokens=tuple(engine.chat_prompt(messages)),
        params=settings.sampling_params(),
        max_tokens=settings.max_tokens,
        drafter=settings.drafter,
        draft_tokens=settings.draft_tokens,
    )


def _settings(args: argparse.Namespace) -> Any:
    from app.settings import Settings

    return Settings(
        default_pair=args.pair,
        temperature=0.0,
        max_tokens=args.max_tokens,
        drafter=args.drafter,
        context_length=args.context,
    )


@dataclasses.dataclass(frozen=True)
class AppRun:
    """What one app run measured."""

    rate: float
    tokens: int
    prompt_tokens: int
    share: float  # UI CPU / wall time, Enter to the stored reply
    per_token: float  # UI CPU seconds per token, same span
    share_decoding: float  # the same from the first token to the last
    per_token_decoding: float
    late_p50: float  # how late the event loop woke while decoding (seconds)
    late_max: float

    @classmethod
    def empty(cls) -> AppRun:
        """A headless run: no UI."""
        return cls(0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


PROBE_SECONDS = 0.05


async def _probe(app: Any, clock: Any, samples: list[tuple[float, float, int, float]]) -> None:
    """Every PROBE_SECONDS: (wall, UI CPU, tokens written so far, how late this wake-up was)."""
    while True:
        asked = time.monotonic()
        await asyncio.sleep(PROBE_SECONDS)
        now = time.monotonic()
        reply = getattr(app.chat_screen, "reply", None)
        event = getattr(reply, "last_event", None) if reply is not None else None
        tokens = event.stats.generated_tokens if event is not None else 0
        samples.append((now, clock(), tokens, now - asked - PROBE_SECONDS))


async def _in_app(runner: Runner, args: argparse.Namespace, *, tints: bool) -> AppRun:
    """The real app writes the same reply; its rate comes from the stored figures.

    Also measures the UI's CPU (of one core): the UI thread's CPU time when the model
    runs in this process, all of this process's when it runs in the engine's. That
    share is what the UI takes from decoding on a machine where decoding uses every
    core, and unlike the rates it is hardly moved by other programs.
    """
    app = runner.app(_settings(args))
    samples: list[tuple[float, float, int, float]] = []
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(2400):
            await pilot.pause(0.05)
            if getattr(app, "engine", None) is not None or getattr(app, "ready", False):
                break
        if tints:
            toggled = app.action_toggle_provenance()
            if inspect.isawaitable(toggled):  # async in later trees
                await toggled
        prompt = app.chat_screen.query_one("#prompt")
        prompt.focus()
        prompt.insert(PROMPT)
        ui_clock = time.thread_time if runner.in_process else time.process_time
        cpu_started, wall_started = ui_clock(), time.monotonic()
        probe = asyncio.create_task(_probe(app, ui_clock, samples))
        await pilot.press("enter")
        while True:  # the worker ends, then its last message is handled
            await app.workers.wait_for_complete()
            await pilot.pause()
            if app.chat_screen.reply is None and app.chat_screen.chat_id is not None:
                break
        probe.cancel()
        ui_seconds = ui_clock() - cpu_started
        ui_share = ui_seconds / (time.monotonic() - wall_started)
        chat_id = app.chat_screen.chat_id
        stored = app.history.messages(chat_id)[-1]
    stats = stored.stats or {}
    tokens = int(stats["generated_tokens"])
    loop = stats.get("loop") or {}
    # The decode window: from the first sample with a token to the first with the last.
    decoding = [sample for sample in samples if sample[2] > 0]
    last = next((i for i, sample in enumerate(decoding) if sample[2] >= tokens), None)
    decoding = decoding[: last + 1] if last is not None else decoding
    share_decoding = per_token_decoding = 0.0
    late = [0.0]
    if len(decoding) >= 2:
        (wall0, cpu0, tokens0, _), (wall1, cpu1, tokens1, _) = decoding[0], decoding[-1]
        share_decoding = (cpu1 - cpu0) / (wall1 - wall0)
        per_token_decoding = (cpu1 - cpu0) / max(1, tokens1 - tokens0)
        late = [sample[3] for sample in decoding[1:]]
    return AppRun(
        rate=float(stats["decode_tokens_per_second"]),
        tokens=tokens,
        prompt_tokens=int(loop.get("prompt_tokens", 0)),
        share=ui_share,
        # Per token too: unlike the share, it does not grow when decoding runs faster.
        per_token=ui_seconds / tokens,
        share_decoding=share_decoding,
        per_token_decoding=per_token_decoding,
        late_p50=statistics.median(late),
        late_max=max(late),
    )


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
