"""Downloads from the Hugging Face hub, against a local server that speaks its protocol.

tests/hub_server.py serves real bytes over a real socket; HF_ENDPOINT points at it and
HF_HOME at this test's own directory (tests/conftest.py), so huggingface_hub's real
HTTP code runs end to end. Small generated files keep most tests fast; one test pulls
the real SmolLM2 GGUF through the command line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest

from app.cli import models as cli_models
from app.errors import (
    ChecksumMismatchError,
    DiskSpaceError,
    DownloadCancelledError,
    DownloadError,
    ModelNotDownloadedError,
)
from app.models.catalog import Catalog
from app.models.catalog_file import load_catalog, parse_catalog
from app.models.disk import format_bytes
from app.models.fit import MachineMemory, pair_fit
from app.models.overview import pair_overview
from app.models.pair_download import PullEvent, PullTracker, download_pair
from app.models.pair_files import pair_state, resolve_pair
from app.models.store import ModelStore
from tests.conftest import TEST_MODELS_DIR
from tests.support.hub_server import FakeHub

TARGET_REPO = "org/tiny-GGUF"
DRAFT_REPO = "org/tiny-draft-GGUF"
MLX_REPO = "org/tiny-mlx"
TARGET_FILE = "tiny-q4.gguf"
DRAFT_FILE = "tiny-draft-q8.gguf"
TARGET_SIZE = 3_000_000
DRAFT_SIZE = 1_500_000
SMOLLM2_KEY = "smollm2-135m-instruct-q4_1"


def catalog_text(*, target_sha: str | None = None) -> str:
    sha_line = f'sha256 = "{target_sha}"\n' if target_sha else ""
    return f"""
[models.tiny-target]
name = "Tiny target"
format = "gguf"
architecture = "llama"
size_bytes = {TARGET_SIZE}
{sha_line}
[models.tiny-target.sources.huggingface]
repo = "{TARGET_REPO}"
filename = "{TARGET_FILE}"

[models.tiny-draft]
name = "Tiny draft"
format = "gguf"
architecture = "llama"
size_bytes = {DRAFT_SIZE}

[models.tiny-draft.sources.huggingface]
repo = "{DRAFT_REPO}"
filename = "{DRAFT_FILE}"

[models.tiny-mlx]
name = "Tiny MLX"
format = "mlx"
architecture = "llama"
size_bytes = 2_100_000

[models.tiny-mlx.sources.huggingface]
repo = "{MLX_REPO}"

[pairs.tiny]
description = "Two tiny hub models."

[pairs.tiny.llamacpp]
target = "tiny-target"
draft = "tiny-draft"

[pairs.tiny.mlx]
target = "tiny-mlx"
"""


@dataclass
class HubSetup:
    hub: FakeHub
    catalog: Catalog
    store: ModelStore
    target_bytes: bytes
    draft_bytes: bytes
    mlx_files: dict[str, bytes]

    @property
    def cache_root(self) -> Path:
        return self.store.hub_cache.root

    def pull(self, runtime: str = "llamacpp", **kwargs: object):
        kwargs.setdefault("check_tokenizers", False)  # random bytes, not GGUF
        return download_pair(self.catalog, "tiny", self.store, runtime=runtime, **kwargs)  # type: ignore[arg-type]

    def incomplete_files(self) -> list[Path]:
        return sorted(self.cache_root.rglob("*.incomplete"))


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubSetup]:
    generator = random.Random(5)
    target = b"GGUF" + generator.randbytes(TARGET_SIZE - 4)
    draft = b"GGUF" + generator.randbytes(DRAFT_SIZE - 4)
    mlx_files = {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": generator.randbytes(2_000_000),
        "tokenizer.json": b'{"version": "1.0"}' + b" " * 2000,
        "README.md": b"not needed by mlx-lm",
    }
    # huggingface_hub reads 10 MB per chunk; small chunks let these small files be cut
    # part-way (drops, cancels) the way a multi-GB file is in real life.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    with FakeHub() as server:
        server.add_repo(TARGET_REPO, {TARGET_FILE: target})
        server.add_repo(DRAFT_REPO, {DRAFT_FILE: draft})
        server.add_repo(MLX_REPO, dict(mlx_files))
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield HubSetup(
            hub=server,
            catalog=parse_catalog(catalog_text(), "test.toml"),
            store=ModelStore(tmp_path / "store"),
            target_bytes=target,
            draft_bytes=draft,
            mlx_files=mlx_files,
        )


def test_a_pair_downloads_into_the_hf_cache_where_other_tools_find_it(hub: HubSetup) -> None:
    events: list[PullEvent] = []
    resolved = hub.pull(on_event=events.append)

    assert resolved.target_path.read_bytes() == hub.target_bytes
    assert resolved.draft_path is not None
    assert resolved.draft_path.read_bytes() == hub.draft_bytes
    assert resolved.target_path.is_relative_to(hub.cache_root / "models--org--tiny-GGUF")
    # huggingface_hub's own cache lookup sees the file: the cache is shared.
    cached = huggingface_hub.try_to_load_from_cache(
        TARGET_REPO, TARGET_FILE, cache_dir=hub.cache_root
    )
    assert cached == str(resolved.target_path)
    assert resolve_pair(hub.catalog, "tiny", hub.store, "llamacpp") == resolved
    assert pair_state(hub.catalog, hub.catalog.pair("tiny"), hub.store, "llamacpp") == "downloaded"
    assert hub.incomplete_files() == []

    last = events[-1]
    assert (last.stage, last.role, last.model_key) == ("done", "draft", "tiny-draft")
    assert last.overall_done == last.overall_total == TARGET_SIZE + DRAFT_SIZE
    target_events = [e for e in events if e.model_key == "tiny-target" and e.stage == "download"]
    assert target_events[-1].model_done == target_events[-1].model_total == TARGET_SIZE
    assert all(e.role == "target" for e in target_events)

    gets = len(hub.hub.file_gets(TARGET_FILE))
    again: list[PullEvent] = []
    hub.pull(on_event=again.append)  # already there: nothing is fetched again
    assert len(hub.hub.file_gets(TARGET_FILE)) == gets
    assert [(e.stage, e.overall_total) for e in again] == [("done", 0), ("done", 0)]


def test_an_mlx_repository_downloads_as_one_snapshot_directory(hub: HubSetup) -> None:
    resolved = hub.pull("mlx")
    directory = resolved.target_path
    assert directory.is_dir()
    assert directory.parent.parent == hub.cache_root / "models--org--tiny-mlx"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (directory / name).read_bytes() == hub.mlx_files[name]
    assert not (directory / "README.md").exists()  # mlx-lm does not need it
    assert resolve_pair(hub.catalog, "tiny", hub.store, "mlx").target_path == directory

    entry = hub.catalog.model("tiny-mlx")
    freed = hub.store.remove(entry)
    assert freed == sum(
        len(hub.mlx_files[n]) for n in ("config.json", "model.safetensors", "tokenizer.json")
    )
    assert hub.store.state(entry) == "absent"
    assert not list((hub.cache_root / "models--org--tiny-mlx" / "blobs").iterdir())


def test_a_dropped_connection_resumes_on_the_next_pull_without_refetching(hub: HubSetup) -> None:
    hub.hub.knobs.drop_after_bytes = 1_000_000
    hub.hub.knobs.status_after_drop = 503  # and the hub stays down for now
    with pytest.raises(DownloadError, match=r"server error \(503\).*kept"):
        hub.pull()
    (partial,) = hub.incomplete_files()
    kept = partial.stat().st_size
    assert 0 < kept <= 1_000_000
    # Nothing unfinished passes for the model.
    assert hub.store.state(hub.catalog.model("tiny-target")) == "partial"
    with pytest.raises(ModelNotDownloadedError):
        resolve_pair(hub.catalog, "tiny", hub.store, "llamacpp")

    hub.hub.knobs.status_after_drop = None
    resolved = hub.pull()
    resumed = hub.hub.file_gets(TARGET_FILE)[-1]
    assert resumed.range == f"bytes={kept}-"
    assert resumed.status == 206
    assert resumed.body_bytes == TARGET_SIZE - kept
    assert resolved.target_path.read_bytes() == hub.target_bytes
    assert hub.incomplete_files() == []


def test_a_drop_within_one_pull_is_resumed_by_a_range_request(hub: HubSetup) -> None:
    hub.hub.knobs.drop_after_bytes = 700_000
    resolved = hub.pull()
    first, second = hub.hub.file_gets(TARGET_FILE)
    assert first.body_bytes == 700_000
    assert second.range is not None and second.range.startswith("bytes=")
    assert resolved.target_path.read_bytes() == hub.target_bytes


def test_corrupted_bytes_are_detected_deleted_and_never_used(hub: HubSetup) -> None:
    hub.hub.knobs.corrupt = {TARGET_FILE}
    with pytest.raises(ChecksumMismatchError) as caught:
        hub.pull()
    message = str(caught.value)
    assert "the hub published" in message and "deleted" in message
    assert message.endswith("draftpen models pull tiny")
    assert hub.incomplete_files() == []
    assert not list((hub.cache_root / "models--org--tiny-GGUF" / "blobs").iterdir())
    assert hub.store.state(hub.catalog.model("tiny-target")) != "downloaded"
    with pytest.raises(ModelNotDownloadedError):
        resolve_pair(hub.catalog, "tiny", hub.store, "llamacpp")


def test_a_hub_file_that_differs_from_the_catalog_sha256_is_not_downloaded(
    hub: HubSetup,
) -> None:
    hub.catalog = parse_catalog(catalog_text(target_sha="0" * 64), "test.toml")
    with pytest.raises(DownloadError, match="the file changed on the hub"):
        hub.pull()
    assert hub.hub.file_gets(TARGET_FILE) == []


def test_a_catalog_sha256_is_checked_when_it_matches_the_hub(hub: HubSetup) -> None:
    sha = hashlib.sha256(hub.target_bytes).hexdigest()
    hub.catalog = parse_catalog(catalog_text(target_sha=sha), "test.toml")
    resolved = hub.pull()
    assert hub.store.verify(hub.catalog.model("tiny-target")) == resolved.target_path


def test_pull_refuses_without_disk_space_for_the_whole_pair(hub: HubSetup) -> None:
    with pytest.raises(DiskSpaceError) as caught:
        hub.pull(free_bytes=lambda path: 4_000_000)
    message = str(caught.value)
    # The sizes come from the hub (Content-Length / X-Linked-Size), both files together.
    assert format_bytes(TARGET_SIZE + DRAFT_SIZE) in message
    assert "model pair 'tiny'" in message
    assert hub.hub.file_gets(TARGET_FILE) == [] and hub.hub.file_gets(DRAFT_FILE) == []


def test_cancel_stops_the_download_and_the_next_pull_resumes(hub: HubSetup) -> None:
    cancel = threading.Event()

    def cancel_part_way(event: PullEvent) -> None:
        if event.overall_done > 1_000_000:
            cancel.set()

    with pytest.raises(DownloadCancelledError, match="cancelled"):
        hub.pull(on_event=cancel_part_way, cancel=cancel)
    (partial,) = hub.incomplete_files()
    kept = partial.stat().st_size
    assert kept > 1_000_000
    with pytest.raises(ModelNotDownloadedError):
        resolve_pair(hub.catalog, "tiny", hub.store, "llamacpp")

    resolved = hub.pull()
    assert hub.hub.file_gets(TARGET_FILE)[-1].range == f"bytes={kept}-"
    assert resolved.target_path.read_bytes() == hub.target_bytes


def test_a_gated_repository_says_how_to_log_in_and_hf_token_opens_it(
    hub: HubSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.hub.repos[TARGET_REPO].token = "hf_secret"
    with pytest.raises(DownloadError) as caught:
        hub.pull()
    message = str(caught.value)
    assert "gated" in message and "hf auth login" in message and "HF_TOKEN" in message
    assert "\n" not in message

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert hub.pull().target_path.read_bytes() == hub.target_bytes


def test_a_server_error_is_a_clear_message(hub: HubSetup) -> None:
    hub.hub.knobs.status = 500
    with pytest.raises(DownloadError, match=r"server error \(500\)"):
        hub.pull()


def test_offline_mode_refuses_to_download_but_resolves_what_is_cached(
    hub: HubSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE"):
        hub.pull()
    assert hub.hub.log == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    resolved = hub.pull()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_pair(hub.catalog, "tiny", hub.store, "llamacpp") == resolved


def test_a_file_huggingface_hub_downloaded_itself_is_adopted_without_a_download(
    hub: HubSetup,
) -> None:
    sha = hashlib.sha256(hub.target_bytes).hexdigest()
    hub.catalog = parse_catalog(catalog_text(target_sha=sha), "test.toml")
    path = huggingface_hub.hf_hub_download(
        TARGET_REPO, TARGET_FILE, cache_dir=hub.cache_root, endpoint=hub.hub.url
    )
    gets = len(hub.hub.file_gets(TARGET_FILE))
    entry = hub.catalog.model("tiny-target")
    assert hub.store.path_if_verified(entry) == Path(path)
    assert hub.store.state(entry) == "downloaded"
    hub.pull()
    assert len(hub.hub.file_gets(TARGET_FILE)) == gets


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
        assert lines[smollm2 + 1].split()[:2] == ["llamacpp", "downloaded"]
        assert "fits" in lines[smollm2 + 1]
        starter = lines.index(next(line for line in lines if line.startswith("starter")))
        assert lines[starter + 1].split()[:2] == ["llamacpp", "absent"]

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
        assert lines[smollm2 + 1].split()[:2] == ["llamacpp", "absent"]


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
