"""Split GGUF files (``-00001-of-0000N.gguf`` shards), against the local hub server.

A catalog model that names the first shard is every shard: pull fetches them all into
one snapshot directory under their own names (where llama.cpp finds the rest beside the
first), each resumable and checked against the hub's sha256; the disk check and the
fit count them all; the pair resolves to the first shard.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants
import pytest

from app.errors import (
    ChecksumMismatchError,
    DiskSpaceError,
    DownloadCancelledError,
    ModelNotDownloadedError,
)
from app.models.catalog import Catalog
from app.models.catalog_file import parse_catalog
from app.models.disk import format_bytes
from app.models.fit import MachineMemory, pair_memory_bytes
from app.models.overview import pair_overview
from app.models.pair_download import PullEvent, download_pair
from app.models.pair_files import ResolvedPair, resolve_pair
from app.models.store import ModelStore
from tests.support.hub_server import FakeHub

SPLIT_REPO = "org/big-GGUF"
DRAFT_REPO = "org/small-GGUF"
SHARDS = {
    "big-Q4_K_M-00001-of-00003.gguf": 600_000,
    "big-Q4_K_M-00002-of-00003.gguf": 500_000,
    "big-Q4_K_M-00003-of-00003.gguf": 200_000,
}
FIRST, SECOND, THIRD = SHARDS
DRAFT_FILE = "small-Q8_0.gguf"
DRAFT_SIZE = 150_000
TOTAL = sum(SHARDS.values())

CATALOG = f"""
[models.big]
name = "Big, in three shards"
format = "gguf"
architecture = "llama"
size_bytes = {TOTAL}
kv_bytes_per_token = 1_000

[models.big.sources.huggingface]
repo = "{SPLIT_REPO}"
filename = "{FIRST}"

[models.small]
name = "Small draft"
format = "gguf"
architecture = "llama"
size_bytes = {DRAFT_SIZE}

[models.small.sources.huggingface]
repo = "{DRAFT_REPO}"
filename = "{DRAFT_FILE}"

[pairs.big]
description = "A split target and a one-file draft."

[pairs.big.llamacpp]
target = "big"
draft = "small"
"""


@dataclass
class SplitHub:
    hub: FakeHub
    catalog: Catalog
    store: ModelStore
    shard_bytes: dict[str, bytes]

    def pull(self, **kwargs: object) -> ResolvedPair:
        kwargs.setdefault("check_tokenizers", False)  # random bytes, not GGUF
        return download_pair(self.catalog, "big", self.store, runtime="llamacpp", **kwargs)  # type: ignore[arg-type]

    def incomplete_files(self) -> list[Path]:
        return sorted(self.store.hub_cache.root.rglob("*.incomplete"))


@pytest.fixture
def split_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[SplitHub]:
    generator = random.Random(19)
    shard_bytes = {name: b"GGUF" + generator.randbytes(size - 4) for name, size in SHARDS.items()}
    # Small chunks let these small files be cut part-way, as a multi-GB shard is.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    with FakeHub() as server:
        server.add_repo(SPLIT_REPO, dict(shard_bytes))
        server.add_repo(DRAFT_REPO, {DRAFT_FILE: generator.randbytes(DRAFT_SIZE)})
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield SplitHub(
            hub=server,
            catalog=parse_catalog(CATALOG, "test.toml"),
            store=ModelStore(tmp_path / "store"),
            shard_bytes=shard_bytes,
        )


def test_pull_fetches_every_shard_into_one_directory_and_the_pair_loads_the_first(
    split_hub: SplitHub,
) -> None:
    events: list[PullEvent] = []
    resolved = split_hub.pull(on_event=events.append)

    assert resolved.target_path.name == FIRST
    directory = resolved.target_path.parent
    # llama.cpp finds shards 2..N beside the first under their original names.
    for name, data in split_hub.shard_bytes.items():
        assert (directory / name).read_bytes() == data
    assert resolve_pair(split_hub.catalog, "big", split_hub.store, "llamacpp") == resolved
    assert split_hub.store.state(split_hub.catalog.model("big")) == "downloaded"
    assert split_hub.incomplete_files() == []
    # One model, one progress bar: the shards add up to the model's bytes.
    big_downloads = [e for e in events if e.model_key == "big" and e.stage == "download"]
    assert big_downloads[-1].model_done == big_downloads[-1].model_total == TOTAL
    assert events[-1].overall_done == events[-1].overall_total == TOTAL + DRAFT_SIZE

    gets = {name: len(split_hub.hub.file_gets(name)) for name in SHARDS}
    split_hub.pull()  # all there: nothing is fetched again
    assert {name: len(split_hub.hub.file_gets(name)) for name in SHARDS} == gets


def test_an_interrupted_shard_resumes_where_it_stopped_and_finished_shards_stay(
    split_hub: SplitHub,
) -> None:
    cancel = threading.Event()
    stop_at = SHARDS[FIRST] + 200_000  # part-way through the second shard

    def cancel_in_second_shard(event: PullEvent) -> None:
        if event.overall_done > stop_at:
            cancel.set()

    with pytest.raises(DownloadCancelledError):
        split_hub.pull(on_event=cancel_in_second_shard, cancel=cancel)
    (partial,) = split_hub.incomplete_files()
    kept = partial.stat().st_size
    assert 0 < kept < SHARDS[SECOND]
    assert split_hub.store.state(split_hub.catalog.model("big")) == "partial"
    with pytest.raises(ModelNotDownloadedError):
        resolve_pair(split_hub.catalog, "big", split_hub.store, "llamacpp")

    resolved = split_hub.pull()
    assert len(split_hub.hub.file_gets(FIRST)) == 1  # the finished shard is not fetched again
    resumed = split_hub.hub.file_gets(SECOND)[-1]
    assert resumed.range == f"bytes={kept}-"
    assert resumed.body_bytes == SHARDS[SECOND] - kept
    assert (resolved.target_path.parent / SECOND).read_bytes() == split_hub.shard_bytes[SECOND]
    assert split_hub.incomplete_files() == []


def test_a_corrupt_shard_is_refused_deleted_and_never_loaded(split_hub: SplitHub) -> None:
    split_hub.hub.knobs.corrupt = {THIRD}
    with pytest.raises(ChecksumMismatchError, match="the hub published") as caught:
        split_hub.pull()
    assert str(caught.value).endswith("draftpen models pull big")
    assert split_hub.incomplete_files() == []
    assert split_hub.store.state(split_hub.catalog.model("big")) != "downloaded"
    with pytest.raises(ModelNotDownloadedError):
        resolve_pair(split_hub.catalog, "big", split_hub.store, "llamacpp")

    split_hub.hub.knobs.corrupt = set()
    resolved = split_hub.pull()  # the good shards are kept; the bad one comes again
    assert len(split_hub.hub.file_gets(FIRST)) == 1
    assert (resolved.target_path.parent / THIRD).read_bytes() == split_hub.shard_bytes[THIRD]


def test_the_disk_check_counts_every_shard(split_hub: SplitHub) -> None:
    with pytest.raises(DiskSpaceError) as caught:
        split_hub.pull(free_bytes=lambda path: TOTAL)  # room for the shards, not the draft
    assert format_bytes(TOTAL + DRAFT_SIZE) in str(caught.value)
    assert all(split_hub.hub.file_gets(name) == [] for name in SHARDS)


def test_the_fit_and_the_menu_count_every_shard(split_hub: SplitHub) -> None:
    machine = MachineMemory(ram_bytes=64_000_000_000)
    (row,) = pair_overview(split_hub.catalog, split_hub.store, machine)
    (variant,) = row.variants
    assert variant.size_bytes == TOTAL + DRAFT_SIZE
    models = split_hub.catalog.models_of(variant.variant)
    assert variant.fit.needed_bytes == pair_memory_bytes(models)
    assert variant.fit.needed_bytes > TOTAL + DRAFT_SIZE


def test_a_split_gguf_already_in_the_hf_cache_is_adopted_only_when_whole(
    split_hub: SplitHub, tmp_path: Path
) -> None:
    resolved = split_hub.pull()
    # Another tool's view: the same cache, but draftpen's records are gone.
    fresh = ModelStore(tmp_path / "other-store", split_hub.store.hub_cache)
    entry = split_hub.catalog.model("big")
    assert fresh.path_if_verified(entry) == resolved.target_path
    (resolved.target_path.parent / THIRD).unlink()
    assert (
        ModelStore(tmp_path / "third-store", split_hub.store.hub_cache).path_if_verified(entry)
        is None
    )
