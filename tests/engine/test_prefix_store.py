"""The prefix cache's files on disk: found by block names, read back whole or not at all,
kept private, within a budget, and a full disk or a damaged file loses nothing else.

A real directory and a real SQLite index; the "state" is bytes, as a runtime's is.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

import pytest

from app.cli import cache as cache_command
from backends.caches import prefix_store
from backends.caches.prefix_keys import BLOCK_TOKENS, block_names, identity_key
from backends.caches.prefix_store import PrefixStore

KEY = identity_key({"weights": "a", "runtime": "test"})
OTHER_KEY = identity_key({"weights": "b", "runtime": "test"})


def tokens_of(blocks: int, *, seed: int = 0, extra: int = 0) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 for i in range(blocks * BLOCK_TOKENS + extra)]


def payload_for(tokens: list[int], size: int = 4096) -> bytes:
    return bytes((len(tokens) + i) % 251 for i in range(size))


def save(store: PrefixStore, tokens: list[int], *, key: str = KEY, cuttable: bool = True) -> bool:
    data = payload_for(tokens)
    return store.write(
        key,
        "test model (target)",
        tokens,
        block_names(key, tokens),
        cuttable=cuttable,
        nbytes=len(data),
        encode=lambda file: file.write(data),
    )


def read_back(store: PrefixStore, prompt: list[int], *, key: str = KEY):
    hit = store.find(key, block_names(key, prompt))
    if hit is None:
        return None, None

    def decode(tokens: tuple[int, ...], file: BinaryIO, nbytes: int) -> bytes:
        return file.read(nbytes)

    read = store.read(hit, key, decode)
    return hit, read


def test_a_prompt_finds_the_longest_saved_prefix_it_shares_and_reads_it_back(
    tmp_path: Path,
) -> None:
    store = PrefixStore(tmp_path, 1 << 20)
    saved = tokens_of(3)
    assert save(store, saved)
    # A prompt that shares the first two blocks and then goes its own way.
    prompt = saved[: 2 * BLOCK_TOKENS] + [7] * (BLOCK_TOKENS + 10)
    hit, read = read_back(store, prompt)
    assert hit is not None and hit.tokens == 2 * BLOCK_TOKENS
    tokens, data = read
    assert list(tokens) == saved and data == payload_for(saved)
    # Sharing less than one block finds nothing.
    assert read_back(store, saved[:100] + [1] * 600)[0] is None


def test_a_recurrent_state_is_found_only_by_a_prompt_that_extends_it_whole(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path, 1 << 20)
    saved = tokens_of(3)
    assert save(store, saved, cuttable=False)
    assert read_back(store, saved[: 2 * BLOCK_TOKENS] + [7] * BLOCK_TOKENS)[0] is None
    hit, _ = read_back(store, saved + [5] * 40)
    assert hit is not None and hit.tokens == 3 * BLOCK_TOKENS


def test_another_models_state_is_never_found_nor_loaded(tmp_path: Path, caplog) -> None:
    store = PrefixStore(tmp_path, 1 << 20)
    saved = tokens_of(2)
    assert save(store, saved, key=OTHER_KEY)
    assert read_back(store, saved)[0] is None  # its block names differ: the key seeds them
    # Even a hit by (forged) name is refused by the file's own key, and the file goes.
    hit = store.find(OTHER_KEY, block_names(OTHER_KEY, saved))
    assert hit is not None
    with caplog.at_level(logging.WARNING):
        assert store.read(hit, KEY, lambda tokens, file, nbytes: file.read(nbytes)) is None
    assert "another model" in caplog.text
    assert store.entries() == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_damaged_file_is_logged_deleted_and_never_loaded(
    tmp_path: Path, caplog, damage: str
) -> None:
    store = PrefixStore(tmp_path, 1 << 20)
    saved = tokens_of(2)
    assert save(store, saved)
    (path,) = tmp_path.glob("*.prefix")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF  # inside the state
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray(os.urandom(len(data)))
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        hit, read = read_back(store, saved)
    assert hit is not None and read is None
    assert "cannot be used" in caplog.text and "the prompt is read instead" in caplog.text
    assert not path.exists() and store.entries() == []


def test_files_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "prefixes"
    store = PrefixStore(directory, 1 << 20)
    assert save(store, tokens_of(2))
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_the_budget_evicts_the_least_recently_used(tmp_path: Path) -> None:
    one_entry = len(payload_for([])) + 4 * 2 * BLOCK_TOKENS + 200
    store = PrefixStore(tmp_path, 3 * one_entry)
    prompts = [tokens_of(2, seed=seed) for seed in range(4)]
    for prompt in prompts[:3]:
        assert save(store, prompt)
    assert read_back(store, prompts[0])[1] is not None  # the first is used again
    assert save(store, prompts[3])
    assert store.used_bytes() <= store.budget_bytes
    assert read_back(store, prompts[1])[0] is None  # least recently used: gone
    for kept in (prompts[0], prompts[2], prompts[3]):
        assert read_back(store, kept)[1] is not None


def test_a_state_larger_than_the_budget_is_not_saved(tmp_path: Path, caplog) -> None:
    store = PrefixStore(tmp_path, 1000)
    with caplog.at_level(logging.INFO):
        assert not save(store, tokens_of(2))
    assert "larger than the whole budget" in caplog.text
    assert list(tmp_path.glob("*.prefix")) == []


def test_a_longer_state_replaces_the_one_it_extends(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path, 1 << 22)
    longer = tokens_of(4)
    assert save(store, longer[: 2 * BLOCK_TOKENS])
    assert save(store, longer)
    assert [entry.tokens for entry in store.entries()] == [len(longer)]
    assert len(list(tmp_path.glob("*.prefix"))) == 1


def test_a_full_disk_skips_the_save_with_one_line_and_keeps_what_was_saved(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    store = PrefixStore(tmp_path, 1 << 22)
    kept = tokens_of(2, seed=1)
    assert save(store, kept)
    # The kernel's own "no space left on device": writes to /dev/full fail with ENOSPC.
    monkeypatch.setattr(prefix_store, "_open_new", lambda path: open("/dev/full", "wb"))  # noqa: SIM115
    with caplog.at_level(logging.WARNING):
        assert not save(store, tokens_of(2, seed=2))
    lines = [r.getMessage() for r in caplog.records if "prefix cache" in r.getMessage()]
    assert len(lines) == 1 and "the disk is full" in lines[0]
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith("tmp-")] == []
    assert read_back(store, kept)[1] is not None


def test_a_restart_forgets_rows_without_files_and_deletes_stale_strays(tmp_path: Path) -> None:
    store = PrefixStore(tmp_path, 1 << 22)
    assert save(store, tokens_of(2, seed=1))
    assert save(store, tokens_of(2, seed=2))
    first, second = sorted(tmp_path.glob("*.prefix"))
    first.unlink()
    stray = tmp_path / "tmp-deadbeef"
    stray.write_bytes(b"half a state")
    old = 10 * prefix_store.STALE_TEMP_SECONDS
    os.utime(stray, (os.path.getatime(stray) - old, os.path.getmtime(stray) - old))
    store.close()
    reopened = PrefixStore(tmp_path, 1 << 22)
    assert len(reopened.entries()) == 1 and second.exists()
    assert not stray.exists()


def test_draftpen_cache_lists_and_clears(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DRAFTPEN_HOME", str(tmp_path / "home"))
    from app.settings import prefix_cache_dir

    store = PrefixStore(prefix_cache_dir(), 1 << 22)
    assert save(store, tokens_of(3))
    out = io.StringIO()
    assert cache_command.list_command(argparse.Namespace(json=False), out) == 0
    assert "test model (target)" in out.getvalue() and "1,536" in out.getvalue()
    out = io.StringIO()
    assert cache_command.list_command(argparse.Namespace(json=True), out) == 0
    listed = json.loads(out.getvalue())
    assert [entry["tokens"] for entry in listed["entries"]] == [3 * BLOCK_TOKENS]
    assert listed["used_bytes"] > 0
    out = io.StringIO()
    assert cache_command.clear_command(argparse.Namespace(), out) == 0
    assert "Deleted 1" in out.getvalue()
    assert list(prefix_cache_dir().glob("*.prefix")) == []
