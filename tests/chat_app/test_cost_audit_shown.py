"""What the user sees of `auto` correcting its figures: stored on disk, in the chat
app's stats bar (through the real engine server), and in `draftpen doctor`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from app.calibration_store import (
    calibration_path,
    keep_corrections,
    read_calibration,
    save_costs,
    stored_calibrations,
)
from app.cli.doctor_calibrations import calibration_lines, calibrations_json
from app.settings import Settings
from backends.speculation.cost_audit import COSTS_NOTE_PREFIX
from backends.speculation.cost_model import CostModel
from tests.chat_app.tui_replies import CODE_REPLY, stats_text
from tests.support.tui_helpers import (
    make_app,
    run,
    scripted_engine,
    send,
    settle,
    stop_engine_servers,  # noqa: F401 (an autouse fixture)
    wait_until_ready,
)

# Figures no forward of the byte model comes near: every measurement disagrees.
ABSURD = {1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0, 16: 10.0}


def test_the_stats_bar_says_what_auto_re_measured_under_the_finished_reply() -> None:
    engine = scripted_engine([CODE_REPLY])
    engine.costs = CostModel(dict(ABSURD))
    app = make_app(
        {"fake": engine}, settings=Settings(default_pair="fake", drafter="auto", temperature=0.0)
    )

    async def body() -> None:
        async with app.run_test(size=(200, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "Write double() twice")
            await settle(app, pilot)
            shown = stats_text(app)
            assert engine.costs is not None and engine.costs.corrections
            assert f"{COSTS_NOTE_PREFIX}one-token forward" in shown
            assert "10000 ms stored" in shown
            # The events say it from the round it happened on, to the end of the reply.
            assert engine.events[-1].costs_note.endswith("10000 ms stored")
            assert not engine.events[0].costs_note

    run(body)


def test_a_correction_is_stored_with_the_curve_and_when_it_was_made() -> None:
    key = "test-key"
    costs = CostModel(
        {1: 0.3, 2: 0.43, 3: 0.28, 16: 1.5}, 0.06, taken_at=time.time() - 3600, others_cpu_share=0.8
    )
    save_costs(key, costs, models="target.gguf + draft.gguf")
    reports: list[str] = []
    keep_corrections(costs, key, "target.gguf + draft.gguf", reports.append)
    costs.observe_verify(1, 0.046)
    costs.observe_verify(1, 0.045)  # two fast ones in a row: replaced
    assert costs.target_seconds[1] == 0.046
    for _ in range(200):  # stored off the loop's thread
        stored = read_calibration(calibration_path(key))
        if stored is not None and stored.correction:
            break
        time.sleep(0.01)
    assert stored is not None and stored.costs.target_seconds[1] == 0.046
    assert stored.correction == "one-token forward 46 ms measured, 300 ms stored"
    assert stored.costs.others_cpu_share == 0.8 and stored.corrected_at is not None
    assert not reports
    # doctor shows the curve, when it was taken and how busy the machine was, and the fix
    lines = "\n".join(calibration_lines(tuple(stored_calibrations())))
    assert "target.gguf + draft.gguf:" in lines
    assert "forward of n tokens (ms) 1: 46, 2: 66" in lines  # scaled with T(1)
    assert "other processes using 80% of the CPUs meanwhile" in lines
    assert "corrected by the loop" in lines and "300 ms stored" in lines
    assert "measured again at the next load" in lines  # 80% busy: taken again
    [data] = calibrations_json(tuple(stored_calibrations()))
    assert data["target_forward_ms"][1] == 46.0 and "other processes" in data["disturbed"]
    json.dumps(data)


def test_an_older_correction_written_last_does_not_undo_a_newer_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each correction is written on its own thread; here the second one's thread runs
    # first, as a busy machine may schedule them.
    held: list[Callable[[], None]] = []

    class HeldThread:
        def __init__(self, target: Callable[[], None], **fields: object) -> None:
            self.target = target

        def start(self) -> None:
            held.append(self.target)

    monkeypatch.setattr(threading, "Thread", HeldThread)
    key = "race-key"
    costs = CostModel({1: 0.3, 2: 0.43, 16: 1.5}, 0.06)
    keep_corrections(costs, key, "target.gguf", lambda message: None)
    costs.observe_verify(1, 0.046)
    costs.observe_verify(1, 0.045)  # the one-token forward corrected
    costs.observe_verify(2, 0.020)  # then the two-token one (scaled with it, not measured)
    assert [c.key for c in costs.corrections] == [1, 2]
    assert len(held) == 2
    for write in reversed(held):
        write()
    stored = read_calibration(calibration_path(key))
    assert stored is not None and stored.correction.startswith("2-token forward")
    assert stored.costs.target_seconds[1] == 0.046 and stored.costs.target_seconds[2] == 0.020


def test_doctor_says_when_nothing_was_measured_and_reads_around_a_damaged_file() -> None:
    assert calibration_lines(()) == [
        "auto's costs: none measured yet (a pair's first load measures them)"
    ]
    path = calibration_path("damaged")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json", encoding="utf-8")
    assert read_calibration(path) is None
    assert stored_calibrations() == []
