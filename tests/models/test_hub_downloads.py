"""Downloads from the Hugging Face hub, against a local server that speaks its protocol.

tests/support/hub_server.py serves real bytes over a real socket; HF_ENDPOINT points at
it and HF_HOME at this test's own directory (tests/conftest.py), so huggingface_hub's
real code downloads: into the HF cache, resumed, verified, refused without space,
cancelled, gated, offline, adopted.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest

from app.errors import (
    ChecksumMismatchError,
    DiskSpaceError,
    DownloadCancelledError,
    DownloadError,
    ModelNotDownloadedError,
)
from app.models.catalog_file import parse_catalog
from app.models.disk import format_bytes
from app.models.pair_download import PullEvent
from app.models.pair_files import pair_state, resolve_pair
from tests.models.hub_pairs import (
    DRAFT_FILE,
    DRAFT_SIZE,
    TARGET_FILE,
    TARGET_REPO,
    TARGET_SIZE,
    HubSetup,
    catalog_text,
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
