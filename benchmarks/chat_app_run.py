"""One run of the real chat app (Textual, headless, driven by its pilot) writing
benchmarks/ui_cost.py's reply: its decode rate as the app stores it, the UI's CPU, and how
late the app's event loop woke while the reply was decoded."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import statistics
import time
from typing import Any

from benchmarks.chat_app_setups import PROMPT, Runner, app_settings


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


async def run_in_app(runner: Runner, args: argparse.Namespace, *, tints: bool) -> AppRun:
    """The real app writes the same reply; its rate comes from the stored figures.

    Also measures the UI's CPU (of one core): the UI thread's CPU time when the model
    runs in this process, all of this process's when it runs in the engine's. That
    share is what the UI takes from decoding on a machine where decoding uses every
    core, and unlike the rates it is hardly moved by other programs.
    """
    app = runner.app(app_settings(args))
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
