"""What a user sees of hub downloads: progress with speed and time left, fit verdicts, the
models menu's rows, Ctrl-C and a full disk, and the real SmolLM2 GGUF through the CLI.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from app.cli import models as cli_models
from app.errors import (
    DiskSpaceError,
)
from app.models.catalog_file import load_catalog
from app.models.fit import MachineMemory, pair_fit
from app.models.overview import pair_overview
from app.models.pair_download import PullEvent, PullTracker
from tests.conftest import TEST_MODELS_DIR
from tests.models.hub_pairs import (
    DRAFT_SIZE,
    TARGET_FILE,
    TARGET_SIZE,
    HubSetup,
)
from tests.support.hub_server import FakeHub

SMOLLM2_KEY = "smollm2-135m-instruct-q4_1"


def test_progress_events_report_speed_and_time_left() -> None:
    times = iter([0.0, 0.5, 1.0, 2.0])
    events: list[PullEvent] = []
    tracker = PullTracker(
        pair="tiny",
        runtime="llamacpp",
        roles={"t": "target", "d": "draft"},
        sizes={"t": 1000, "d": 1000},
        on_event=events.append,
        clock=lambda: next(times),
    )
    tracker("t", "download", 0, 1000)
    tracker("t", "download", 500, 1000)
    tracker("t", "download", 1000, 1000)
    tracker("t", "done", 1000, 1000)
    assert events[0].bytes_per_second is None
    assert events[2].bytes_per_second == pytest.approx(1000.0)
    assert events[2].overall_done == 1000 and events[2].overall_total == 2000
    assert events[2].eta_seconds == pytest.approx(1.0)
    assert events[3].role == "target"


def test_fit_verdicts_count_both_models_and_their_kv_caches() -> None:
    catalog = load_catalog()
    starter = catalog.models_of(catalog.pair("starter").variant("llamacpp"))
    gib = 2**30
    on_gpu = pair_fit(starter, MachineMemory(16 * gib, "RTX", 8 * gib), n_ctx=4096)
    assert on_gpu.place == "gpu" and on_gpu.summary.startswith("fits GPU")
    weights = sum(model.size_bytes for model in starter)
    assert on_gpu.needed_bytes > weights  # KV caches and buffers on top of the weights
    small_gpu = pair_fit(starter, MachineMemory(16 * gib, "old GPU", 1 * gib))
    assert small_gpu.place == "ram" and "CPU only" in small_gpu.summary
    tiny_machine = pair_fit(starter, MachineMemory(2 * gib))
    assert not tiny_machine.fits and tiny_machine.summary.startswith("too big")
    longer = pair_fit(starter, MachineMemory(16 * gib), n_ctx=32768)
    assert longer.needed_bytes > on_gpu.needed_bytes


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="draftpen")
    commands = parser.add_subparsers(dest="command")
    cli_models.register(commands)
    args = parser.parse_args(list(argv))
    exit_code: int = args.func(args)
    return exit_code


def test_the_real_smollm2_gguf_pulls_lists_and_removes_through_the_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = load_catalog()
    entry = catalog.model(SMOLLM2_KEY)
    source_file = TEST_MODELS_DIR / entry.filename
    if not source_file.exists():
        if os.environ.get("DRAFTPEN_REQUIRE_MODELS"):
            pytest.fail(f"{source_file} is missing; run: draftpen models pull smollm2")
        pytest.skip(f"{source_file} is not downloaded")
    source = entry.sources.huggingface
    assert source is not None and source.revision is not None
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(tmp_path / "store"))
    with FakeHub() as server:
        server.add_repo(source.repo, {source.filename: source_file}, commit=source.revision)  # type: ignore[union-attr]
        monkeypatch.setenv("HF_ENDPOINT", server.url)

        assert run_cli("models", "pull", "smollm2", "--runtime", "llamacpp") == 0
        assert "Pair 'smollm2' is downloaded and verified" in capsys.readouterr().err
        assert run_cli("models", "check", "smollm2", "--runtime", "llamacpp") == 0
        assert f"ok       {SMOLLM2_KEY}  sha256 {entry.sha256}" in capsys.readouterr().out

        assert run_cli("models", "list") == 0
        lines = capsys.readouterr().out.splitlines()
        smollm2 = lines.index(next(line for line in lines if line.startswith("smollm2")))
        assert lines[smollm2 + 1].split()[:3] == ["llamacpp", "ngram", "downloaded"]
        assert "fits" in lines[smollm2 + 1]
        starter = lines.index(next(line for line in lines if line.startswith("starter")))
        assert lines[starter + 1].split()[:3] == ["llamacpp", "model", "absent"]

        assert run_cli("models", "rm", "smollm2", "--runtime", "llamacpp") == 0
        assert "freed 98.4 MB" in capsys.readouterr().out
        blobs = (
            Path(os.environ["HF_HOME"])
            / "hub"
            / "models--QuantFactory--SmolLM2-135M-Instruct-GGUF"
            / "blobs"
        )
        assert list(blobs.iterdir()) == []
        assert run_cli("models", "list") == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[smollm2 + 1].split()[:3] == ["llamacpp", "ngram", "absent"]


def test_ctrl_c_keeps_the_partial_download_for_the_next_pull(hub: HubSetup) -> None:
    def interrupt_part_way(event: PullEvent) -> None:
        if event.stage == "download" and event.overall_done > 800_000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hub.pull(on_event=interrupt_part_way)
    (partial,) = hub.incomplete_files()
    kept = partial.stat().st_size
    assert hub.store.state(hub.catalog.model("tiny-target")) == "partial"
    hub.pull()
    assert hub.hub.file_gets(TARGET_FILE)[-1].range == f"bytes={kept}-"


def test_a_full_disk_is_a_clear_message_and_the_download_can_continue(
    hub: HubSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from app.models import hub as hub_module

    real_write = hub_module._WatchedFile.write
    written = 0

    def write_until_full(self: object, chunk: bytes) -> int:
        nonlocal written
        if written > 500_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        written += len(chunk)
        return real_write(self, chunk)  # type: ignore[arg-type]

    monkeypatch.setattr(hub_module._WatchedFile, "write", write_until_full)
    with pytest.raises(DiskSpaceError, match=r"filled up.*continues where it stopped"):
        hub.pull()
    monkeypatch.setattr(hub_module._WatchedFile, "write", real_write)
    assert hub.pull().target_path.read_bytes() == hub.target_bytes


def test_the_models_menu_rows_show_states_and_fit_verdicts(hub: HubSetup) -> None:
    hub.pull()
    gib = 2**30
    rows = pair_overview(hub.catalog, hub.store, MachineMemory(16 * gib, "RTX", 8 * gib))
    (tiny,) = rows
    assert (tiny.name, tiny.description) == ("tiny", "Two tiny hub models.")
    gguf, mlx = tiny.variants
    assert (gguf.runtime, gguf.state, mlx.runtime, mlx.state) == (
        "llamacpp",
        "downloaded",
        "mlx",
        "absent",
    )
    assert [(m.role, m.entry.key, m.state) for m in gguf.models] == [
        ("target", "tiny-target", "downloaded"),
        ("draft", "tiny-draft", "downloaded"),
    ]
    assert gguf.size_bytes == TARGET_SIZE + DRAFT_SIZE
    assert gguf.fit.place == "gpu" and gguf.is_this_machines_runtime

    real = {
        row.name: row for row in pair_overview(load_catalog(), hub.store, MachineMemory(16 * gib))
    }
    assert real["starter"].variant("llamacpp").fit.place == "ram"  # type: ignore[union-attr]
    assert not real["coder-32b"].variant("llamacpp").fit.fits  # type: ignore[union-attr]
