"""On the real starter pair: a calibration stored on a busy machine (issue 51's curve,
scaled to this machine) is corrected within the first reply, and on disk."""

from __future__ import annotations

import statistics
import time

import pytest

from app.calibration_store import (
    calibration_key,
    calibration_path,
    keep_corrections,
    read_calibration,
    save_costs,
)
from app.loading import load_engine
from backends.base import ChatMessage
from backends.engine import GenerationRequest
from backends.speculation.calibration import disturbed, time_forward
from backends.speculation.cost_model import CostModel

pytestmark = pytest.mark.real_model

# Stored during a compile on the 2-core EPYC, where a quiet one-token forward is 45 ms.
BUSY_CURVE = {1: 0.295, 2: 0.428, 3: 0.283, 4: 0.500, 5: 0.808, 8: 1.453, 16: 1.469}
BUSY_DRAFT_STEP = 0.059
QUIET_ONE_TOKEN = 0.045


def test_a_busy_calibration_is_corrected_within_the_first_reply_and_on_disk() -> None:
    engine = load_engine("starter", n_ctx=2048, calibrate=False)
    try:
        prompt = engine.chat_prompt(
            [ChatMessage("user", "Write a Python function that merges two sorted lists.")]
        )
        # What a one-token forward costs here now, where the reply begins.
        target = engine.target
        target.rollback(0)
        target.prefill(prompt[:-1])
        one = statistics.median(time_forward(target, prompt[-1:])[0] for _ in range(3))
        target.rollback(0)
        scale = one / QUIET_ONE_TOKEN
        busy = CostModel(
            {size: seconds * scale for size, seconds in BUSY_CURVE.items()},
            BUSY_DRAFT_STEP * scale,
        )
        assert disturbed(busy) is not None  # the next load would measure it again
        key = calibration_key(engine, "llamacpp")
        save_costs(key, busy, models="starter")
        keep_corrections(busy, key, "starter", lambda message: None)
        engine.costs = busy

        request = GenerationRequest(tuple(prompt), max_tokens=96, drafter="auto")
        events = list(engine.generate(request))

        first = next(correction for correction in busy.corrections if correction.key == 1)
        assert first.stored_seconds == pytest.approx(BUSY_CURVE[1] * scale)
        assert first.measured_seconds * 1.5 < first.stored_seconds
        # Found within the first few rounds, and said from there on.
        noted = next(index for index, event in enumerate(events) if event.costs_note)
        assert noted <= 8, [event.decision for event in events[:10]]
        assert events[-1].costs_note.startswith("one-token forward")
        # Stored off the loop's thread, after every correction of the reply (the one-token
        # cost first; the other sizes may follow, and the file holds the latest).
        latest = busy.corrections[-1].describe()
        for _ in range(300):
            stored = read_calibration(calibration_path(key))
            if stored is not None and stored.correction == latest:
                break
            time.sleep(0.01)
        assert stored is not None and stored.correction == latest
        assert stored.costs.target_seconds[1] * 1.5 < BUSY_CURVE[1] * scale
    finally:
        engine.close()
