"""Calibrations survive a restart and are redone when the pair or the runtime changes."""

from __future__ import annotations

from app.calibration_store import (
    calibration_key,
    calibration_path,
    ensure_calibrated,
    load_costs,
    save_costs,
)
from backends.engine import Engine
from backends.speculation.cost_model import CostModel
from tests.support.fakes import HashModel, draft_model_for


class CountingEngine(Engine):
    """An engine over fake models that counts how often it measures."""

    calibrations = 0

    def calibrate(self) -> CostModel:
        CountingEngine.calibrations += 1
        self.costs = CostModel({1: 0.03, 2: 0.05, 4: 0.09, 8: 0.2}, 0.02, exact_batch_limit=5)
        return self.costs


def test_calibration_is_loaded_from_disk_after_a_restart():
    CountingEngine.calibrations = 0
    target = HashModel()
    first = CountingEngine(target, draft_model_for(target))
    measured = ensure_calibrated(first, "llamacpp")
    assert CountingEngine.calibrations == 1

    restarted = CountingEngine(target, draft_model_for(target))
    loaded = ensure_calibrated(restarted, "llamacpp")
    assert CountingEngine.calibrations == 1
    assert loaded.target_seconds == measured.target_seconds
    assert loaded.draft_step_seconds == measured.draft_step_seconds
    assert loaded.exact_batch_limit == 5
    assert restarted.costs is loaded


def test_calibration_is_redone_when_the_runtime_or_the_pair_changes():
    CountingEngine.calibrations = 0
    target = HashModel()
    with_draft = CountingEngine(target, draft_model_for(target))
    ensure_calibrated(with_draft, "llamacpp")
    ensure_calibrated(with_draft, "mlx")
    assert CountingEngine.calibrations == 2
    without_draft = CountingEngine(target)
    assert calibration_key(without_draft, "llamacpp") != calibration_key(with_draft, "llamacpp")
    ensure_calibrated(without_draft, "llamacpp")
    assert CountingEngine.calibrations == 3


def test_damaged_calibration_file_is_measured_again():
    target = HashModel()
    engine = CountingEngine(target)
    key = calibration_key(engine, "llamacpp")
    save_costs(key, CostModel({1: 0.1}))
    calibration_path(key).write_text("{not json")
    assert load_costs(key) is None
    CountingEngine.calibrations = 0
    ensure_calibrated(engine, "llamacpp")
    assert CountingEngine.calibrations == 1
    assert load_costs(key) is not None


def test_a_target_split_over_workers_is_calibrated_apart_per_split():
    target = HashModel()
    here = CountingEngine(target)
    key_here = calibration_key(here, "llamacpp")
    target.placement = "this machine"  # type: ignore[attr-defined]
    assert calibration_key(here, "llamacpp") == key_here  # the key it always had
    target.placement = "9 layers on this CPU, ~10 on a:1, ~10 on b:2"  # type: ignore[attr-defined]
    split = calibration_key(here, "llamacpp")
    target.placement = "0 layers on this CPU, ~14 on a:1, ~14 on b:2"  # type: ignore[attr-defined]
    assert len({key_here, split, calibration_key(here, "llamacpp")}) == 3


class BusyThenQuietEngine(CountingEngine):
    """Measures once while the machine is busy (a compile running), then calmly."""

    def calibrate(self) -> CostModel:
        CountingEngine.calibrations += 1
        if CountingEngine.calibrations == 1:
            self.costs = CostModel({1: 0.036, 2: 0.07, 4: 1.1, 8: 0.3, 16: 0.95}, 0.02)
        else:
            self.costs = CostModel({1: 0.036, 2: 0.07, 4: 0.10, 8: 0.24, 16: 0.36}, 0.02)
        return self.costs


def test_a_calibration_taken_on_a_busy_machine_serves_unstored_and_the_next_start_measures():
    CountingEngine.calibrations = 0
    engine = BusyThenQuietEngine(HashModel())
    key = calibration_key(engine, "llamacpp")
    said: list[str] = []
    costs = ensure_calibrated(engine, "llamacpp", said.append)
    # Measured once (the load waits for no second try), used for now, not stored.
    assert CountingEngine.calibrations == 1
    assert costs.target_seconds[4] == 1.1 and engine.costs is costs
    assert any("looked busy" in line and "4 tokens took 1100 ms" in line for line in said), said
    assert load_costs(key) is None
    # The next start measures again (calmly now) and keeps that one.
    said.clear()
    assert ensure_calibrated(engine, "llamacpp", said.append).target_seconds[4] == 0.10
    assert CountingEngine.calibrations == 2
    assert load_costs(key).target_seconds[4] == 0.10
    # A disturbed one already on disk (an older draftpen kept it) is measured again too.
    save_costs(key, CostModel({1: 0.036, 2: 0.07, 4: 1.1, 8: 0.3, 16: 0.95}, 0.02))
    said.clear()
    assert ensure_calibrated(engine, "llamacpp", said.append).target_seconds[4] == 0.10
    assert any("stored calibration looks disturbed" in line for line in said), said
    assert load_costs(key).target_seconds[4] == 0.10  # the sound one replaced it


def test_a_kernel_threshold_is_not_taken_for_a_disturbance():
    from backends.speculation.calibration import disturbed

    # A batch of 4 cheaper than one of 3 (repacked kernels); a GPU's flat curve.
    assert disturbed(CostModel({1: 0.034, 2: 0.063, 3: 0.11, 4: 0.09, 8: 0.24})) is None
    assert disturbed(CostModel({1: 0.020, 2: 0.0205, 4: 0.021, 8: 0.023, 16: 0.028})) is None
    assert "under half" in str(disturbed(CostModel({1: 0.03, 2: 0.06, 4: 0.2, 8: 0.09})))
