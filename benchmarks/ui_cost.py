"""What the chat app's UI costs decoding: its decode rate against the same generation headless.

Alternates a headless generation with the real chat app (Textual, headless, driven by
its pilot) writing the same reply with Markdown and with draft colours. Greedy, fixed
prompt and length, so every run writes the same text; the rate is the loop's own
decode rate (prefill excluded), as the app stores it. Ratios are taken within the run,
against the mean headless rate, because this machine's speed drifts.

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
    return parser.parse_args()


def main() -> int:
    """Run the comparison and print a table of rates and ratios."""
    args = _parse()
    tree = (args.tree or Path(__file__).resolve().parent.parent).resolve()
    sys.path.insert(0, str(tree))
    # History and settings of these runs stay out of the user's own.
    os.environ["DRAFTPEN_HOME"] = tempfile.mkdtemp(prefix="draftpen-ui-cost-")

    from app.tui.app import DraftpenApp

    in_process = "engine_loader" in inspect.signature(DraftpenApp).parameters
    print(f"tree: {tree} ({'in-process' if in_process else 'engine client'})", file=sys.stderr)
    with _in_process_engine(args) if in_process else _engine_process(args, tree) as runner:
        runs = _alternate(runner, args)
    _report(runs, args, tree, "in-process" if in_process else "engine client")
    return 0


class Runner:
    """How one set-up writes the reply headless, and how it builds the app."""

    in_process = False

    def headless(self) -> tuple[float, int]:
        """The reply with no UI: (decode tok/s, tokens)."""
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
            ui_share = ui_per_token = 0.0
            if mode == "headless":
                rate, tokens = runner.headless()
            else:
                tints = mode == "app tints"
                rate, tokens, ui_share, ui_per_token = asyncio.run(
                    _in_app(runner, args, tints=tints)
                )
            runs.append(
                {
                    "repeat": repeat,
                    "mode": mode,
                    "tok_s": rate,
                    "tokens": tokens,
                    "ui_cpu_share": ui_share,
                    "ui_cpu_ms_per_token": ui_per_token * 1000,
                    "ui_niceness_before": niceness,
                }
            )
            print(
                f"  {repeat} {mode:13s} {rate:6.2f} tok/s ({tokens} tokens) UI CPU {ui_share:.1%}, "
                f"{ui_per_token * 1000:.1f} ms/token",
                file=sys.stderr,
            )
    return runs


@contextlib.contextmanager
def _in_process_engine(args: argparse.Namespace) -> Iterator[Runner]:
    from app.chats.history import History
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

        def headless(self) -> tuple[float, int]:
            request = _request(engine, args)
            last: list[Any] = []

            def drain() -> None:
                for event in engine.generate(request):
                    last[:] = [event]

            thread = threading.Thread(target=drain)
            thread.start()
            thread.join()
            return last[0].stats.decode_tokens_per_second, last[0].stats.generated_tokens

        def app(self, settings: Any) -> Any:
            return DraftpenApp(
                engine_loader=lambda name, settings, progress: engine,
                history=History(),
                settings=settings,
                pair_name=args.pair,
            )

    try:
        yield InProcess()
    finally:
        loaded.close()


@contextlib.contextmanager
def _engine_process(args: argparse.Namespace, tree: Path) -> Iterator[Runner]:
    from app.chats.history import History
    from app.client import ChatTurn, EngineClient, find_engine
    from app.tui.app import DraftpenApp
    from backends.base import ChatMessage
    from backends.speculative import GenerationEvent

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
            def headless(self) -> tuple[float, int]:
                last: list[Any] = []

                def drain() -> None:
                    for item in client.chat(turn, threading.Event()):
                        if isinstance(item, GenerationEvent):
                            last[:] = [item]

                thread = threading.Thread(target=drain)
                thread.start()
                thread.join()
                return last[0].stats.decode_tokens_per_second, last[0].stats.generated_tokens

            def app(self, settings: Any) -> Any:
                return DraftpenApp(
                    connect=lambda settings, status: EngineClient(socket_path),
                    history=History(),
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


async def _in_app(
    runner: Runner, args: argparse.Namespace, *, tints: bool
) -> tuple[float, int, float, float]:
    """The real app writes the same reply; its rate comes from the stored figures.

    Also returns the UI's CPU share while the reply was written (of one core): the UI
    thread's CPU time when the model runs in this process, all of this process's when
    it runs in the engine's. That share is what the UI takes from decoding on a
    machine where decoding uses every core, and unlike the rates it is hardly moved by
    other programs.
    """
    app = runner.app(_settings(args))
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(2400):
            await pilot.pause(0.05)
            if getattr(app, "engine", None) is not None or getattr(app, "ready", False):
                break
        if tints:
            app.action_toggle_provenance()
        prompt = app.chat_screen.query_one("#prompt")
        prompt.focus()
        prompt.insert(PROMPT)
        ui_clock = time.thread_time if runner.in_process else time.process_time
        cpu_started, wall_started = ui_clock(), time.monotonic()
        await pilot.press("enter")
        while True:  # the worker ends, then its last message is handled
            await app.workers.wait_for_complete()
            await pilot.pause()
            if app.chat_screen.reply is None and app.chat_screen.chat_id is not None:
                break
        ui_seconds = ui_clock() - cpu_started
        ui_share = ui_seconds / (time.monotonic() - wall_started)
        chat_id = app.chat_screen.chat_id
        stored = app.history.messages(chat_id)[-1]
    stats = stored.stats or {}
    tokens = int(stats["generated_tokens"])
    # Per token too: unlike the share, it does not grow when decoding runs faster.
    return float(stats["decode_tokens_per_second"]), tokens, ui_share, ui_seconds / tokens


def _report(runs: list[dict[str, Any]], args: argparse.Namespace, tree: Path, setup: str) -> None:
    headless = statistics.mean(run["tok_s"] for run in runs if run["mode"] == "headless")
    print(
        f"\nUI cost ({setup}), pair {args.pair}, drafter {args.drafter}, {args.max_tokens} "
        f"tokens, {args.repeats} repeats, tree {tree}"
    )
    print(
        f"{'mode':14s} {'mean tok/s':>10s} {'vs headless':>11s} {'UI CPU':>7s} "
        f"{'UI ms/tok':>9s}  runs"
    )
    summary = {}
    for mode in MODES:
        rates = [run["tok_s"] for run in runs if run["mode"] == mode]
        mean = statistics.mean(rates)
        share = statistics.mean(run["ui_cpu_share"] for run in runs if run["mode"] == mode)
        per_token = statistics.mean(
            run["ui_cpu_ms_per_token"] for run in runs if run["mode"] == mode
        )
        summary[mode] = {
            "mean_tok_s": mean,
            "ratio": mean / headless,
            "ui_cpu_share": share,
            "ui_cpu_ms_per_token": per_token,
            "runs": rates,
        }
        listed = " ".join(f"{rate:.2f}" for rate in rates)
        print(
            f"{mode:14s} {mean:10.2f} {mean / headless:10.2f}x {share:7.1%} "
            f"{per_token:9.1f}  {listed}"
        )
    if args.json:
        document = {"setup": setup, "tree": str(tree), "runs": runs, "summary": summary}
        args.json.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    sys.exit(main())
