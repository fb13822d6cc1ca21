"""Earlier replies kept for drafting (issue 55): the engine remembers what it wrote,
keeps it private and bounded on disk per tokenizer, and a later engine drafts from it."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from app.cli import cache as cache_command
from app.errors import DraftpenError, SettingsError
from app.settings import Settings, history_index_bytes
from backends.caches.draft_history import (
    SUFFIX,
    HistorySettings,
    clear_histories,
    stored_histories,
    tokenizer_key,
)
from backends.caches.history_file import write_history
from backends.engine import Engine, GenerationRequest, draft_history
from backends.sampling.filters import SamplingParams
from tests.support.fake_runs import chat_prompt
from tests.support.fakes import HashModel, ScriptedTextModel

SCRIPT = "the answer is 42, and the reason is in the notes, once and again"


def history(directory: Path, budget: int = 1 << 20) -> HistorySettings:
    return HistorySettings(directory, budget)


def reply(engine: Engine, prompt: list[int]) -> tuple[list[int], int]:
    """The reply's tokens and how many came from accepted drafts (n-gram drafter, K=8)."""
    tokens: list[int] = []
    drafted = 0
    request = GenerationRequest(tuple(prompt), drafter="ngram", draft_tokens=8, max_tokens=200)
    for event in engine.generate(request):
        tokens.extend(event.tokens)
        drafted += sum(event.from_draft)
    return tokens, drafted


def test_the_same_request_again_is_drafted_from_the_index(tmp_path: Path) -> None:
    target = ScriptedTextModel(SCRIPT, n_ctx=1024)
    remembered = draft_history(history(tmp_path / "history"), target)
    engine = Engine(target, history=remembered)
    prompt = chat_prompt(target, "why")
    first, drafted_first = reply(engine, prompt)
    assert remembered.flush(10)
    again, drafted_again = reply(engine, prompt)
    assert again == first
    assert drafted_again >= 0.7 * len(again) > drafted_first
    engine.close()


def test_a_later_engine_drafts_from_what_an_earlier_one_wrote(tmp_path: Path) -> None:
    directory = tmp_path / "history"
    target = ScriptedTextModel(SCRIPT, n_ctx=1024)
    engine = Engine(target, history=draft_history(history(directory), target))
    prompt = chat_prompt(target, "why")
    first, _ = reply(engine, prompt)
    engine.close()  # saves
    later = ScriptedTextModel(SCRIPT, n_ctx=1024)
    loaded = draft_history(history(directory), later)
    assert loaded.flush(10)  # loaded in the background: a reply that starts first drafts less
    assert loaded.stats().loaded_tokens > len(first)
    again, drafted = reply(Engine(later, history=loaded), prompt)
    assert again == first and drafted >= 0.7 * len(again)


def test_the_directory_and_files_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "history"
    target = ScriptedTextModel(SCRIPT)
    remembered = draft_history(history(directory), target)
    remembered.add([1, 2, 3], [10, 11, 12, 13])
    remembered.close()
    files = list(directory.glob(f"*{SUFFIX}"))
    assert len(files) == 1
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert not list(directory.glob("tmp-*"))


def test_adding_a_reply_returns_at_once_and_the_thread_indexes_it(tmp_path: Path) -> None:
    remembered = draft_history(history(tmp_path), HashModel())
    assert remembered.flush(10)
    busy = remembered.index._lock
    busy.acquire()  # the index busy for two seconds: indexing must wait for it
    threading.Timer(2.0, busy.release).start()
    remembered.add([1, 2, 3], list(range(10, 40)))
    assert busy.locked(), "add() returned while the index was still busy"
    assert remembered.stats().added_streams == 0
    assert remembered.flush(10)
    assert remembered.stats().added_streams == 1 and len(remembered.index) > 30
    remembered.close()


@pytest.mark.parametrize(
    "damage", ["truncated", "flipped byte", "not a history file", "another tokenizer"]
)
def test_a_damaged_or_foreign_file_is_deleted_and_read_around(
    tmp_path: Path, damage: str, caplog
) -> None:
    directory = tmp_path / "history"
    target = ScriptedTextModel(SCRIPT)
    remembered = draft_history(history(directory), target)
    remembered.add([1, 2, 3], list(range(10, 60)))
    remembered.close()
    (path,) = directory.glob(f"*{SUFFIX}")
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[:-9]
    elif damage == "flipped byte":
        data[-30] ^= 0xFF
    elif damage == "not a history file":
        data = bytearray(b"hello" * 20)
    else:
        with path.open("wb") as raw:
            write_history(raw, "0" * 32, "another", remembered.index.stored())
        data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        again = draft_history(history(directory), target)
        assert again.flush(10)
    assert not path.exists() and "deleted" in caplog.text
    assert len(again.index) == 0
    again.add([1, 2, 3], list(range(10, 60)))  # and it goes on remembering
    again.close()
    assert path.exists()


def test_another_tokenizers_file_is_kept_but_never_loaded(tmp_path: Path) -> None:
    directory = tmp_path / "history"
    target = HashModel()
    other_key = "f" * 32
    directory.mkdir(mode=0o700)
    with (directory / f"{other_key}{SUFFIX}").open("wb") as raw:
        write_history(raw, other_key, "other tokenizer", np.arange(100))
    remembered = draft_history(history(directory), target)
    assert remembered.flush(10)
    assert remembered.key == tokenizer_key(target) != other_key
    assert len(remembered.index) == 0
    assert (directory / f"{other_key}{SUFFIX}").exists()
    remembered.close()


def test_the_disk_budget_deletes_the_least_recently_written_other_tokenizers(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "history"
    directory.mkdir(mode=0o700)
    for number, key in enumerate(("a" * 32, "b" * 32)):
        path = directory / f"{key}{SUFFIX}"
        with path.open("wb") as raw:
            write_history(raw, key, key, np.arange(20_000))
        os.utime(path, (1000 + number, 1000 + number))
    remembered = draft_history(history(directory, budget=100_000), HashModel())
    remembered.add([1, 2, 3], list(range(10, 40)))
    remembered.close()
    names = {path.stem for path in directory.glob(f"*{SUFFIX}")}
    assert names == {"b" * 32, remembered.key}  # the older "a" went
    assert sum(item.nbytes for item in stored_histories(directory)) <= 100_000


def test_the_index_is_bounded_in_ram(tmp_path: Path) -> None:
    remembered = draft_history(history(tmp_path, budget=400_000), HashModel())
    for _ in range(100):
        remembered.add([], list(range(10, 60)) * 4)
    remembered.close()
    index = remembered.index
    assert len(index) == index.capacity
    arrays = [index._tokens, *index._heads.values(), *index._chains.values()]
    assert sum(array.nbytes for array in arrays) <= 400_000


def test_draftpen_cache_lists_and_clears_the_history(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DRAFTPEN_HOME", str(tmp_path / "home"))
    from app.settings import history_index_dir

    remembered = draft_history(history(history_index_dir()), HashModel(name="tiny"))
    remembered.add([1, 2, 3], list(range(10, 60)))
    remembered.close()
    out = io.StringIO()
    assert cache_command.list_command(argparse.Namespace(json=False), out) == 0
    assert "Earlier replies kept for drafting" in out.getvalue()
    assert "tiny tokenizer" in out.getvalue()
    out = io.StringIO()
    assert cache_command.list_command(argparse.Namespace(json=True), out) == 0
    listed = json.loads(out.getvalue())["history"]
    assert [entry["tokens"] for entry in listed["entries"]] == [len(remembered.index)]
    out = io.StringIO()
    assert cache_command.clear_command(argparse.Namespace(), out) == 0
    assert "earlier replies of 1 tokenizer (" in out.getvalue()
    assert stored_histories(history_index_dir()) == []


def test_the_setting_and_the_flag_bound_it_or_turn_it_off(tmp_path: Path, monkeypatch) -> None:
    from app.engine.cache_options import history_settings_from

    monkeypatch.setenv("DRAFTPEN_HOME", str(tmp_path / "home"))
    assert history_index_bytes("auto") == 48 << 20
    assert history_index_bytes("64MiB") == 64 << 20
    with pytest.raises(SettingsError):
        Settings(history_index="lots")
    assert history_settings_from("0", Settings()) is None
    assert history_settings_from(None, Settings(history_index="0")) is None
    chosen = history_settings_from("8MiB", Settings(history_index="0"))
    assert chosen is not None and chosen.budget_bytes == 8 << 20
    with pytest.raises(DraftpenError, match="--history-index"):
        history_settings_from("lots", Settings())


def test_clearing_the_files_makes_a_running_engine_forget_too(tmp_path: Path) -> None:
    directory = tmp_path / "history"
    remembered = draft_history(history(directory), HashModel())
    first = list(range(10, 60))
    remembered.add([1, 2, 3], first)
    remembered.save()
    assert remembered.flush(10) and remembered.index.lookup(first[:20], 4).tokens
    clear_histories(directory)
    remembered.add([4, 5, 6], list(range(7, 30)))
    remembered.close()
    assert remembered.index.lookup(first[:20], 4).tokens == []
    assert len(list(directory.glob(f"*{SUFFIX}"))) == 1
    again = draft_history(history(directory), HashModel())
    assert again.flush(10)
    assert again.index.lookup(first[:20], 4).tokens == []
    assert again.index.lookup(list(range(7, 20)), 4).tokens == [20, 21, 22, 23]
    again.close()


def test_a_seeded_sampled_reply_is_the_same_reply_after_the_index_learned_it(
    tmp_path: Path,
) -> None:
    # Rejection sampling draws by the drafts: drafts from the index, which grows with
    # every reply, would make the seed give another reply the second time.
    target = HashModel(n_ctx=1024)
    remembered = draft_history(history(tmp_path / "history"), target)
    engine = Engine(target, history=remembered)
    prompt = tuple(chat_prompt(target, "tell me a story"))
    params = SamplingParams(temperature=0.9, seed=7)

    def seeded() -> list[int]:
        request = GenerationRequest(
            prompt, params=params, drafter="ngram", draft_tokens=4, max_tokens=64
        )
        return [token for event in engine.generate(request) for token in event.tokens]

    first = seeded()
    assert remembered.flush(10) and remembered.stats().added_tokens >= len(first)
    assert seeded() == first
    # Greedy replies still draft from it.
    greedy = GenerationRequest(prompt, drafter="ngram", draft_tokens=8, max_tokens=64)
    list(engine.generate(greedy))
    assert remembered.flush(10)
    events = list(engine.generate(greedy))
    assert any(event.drafter == "ngram" and any(event.from_draft) for event in events)
    engine.close()
