"""Prompt prefixes saved to disk by one engine and loaded by the next, on llama.cpp.

Real models (marked ``real_model``): SmolLM2 as target (exact kernels) and as its own
draft, and the tiny hybrid model the tests write (its recurrent state is loaded whole).
Each test starts two engines one after the other on a fresh model object, as two
sessions of ``draftpen serve`` would, sharing one directory.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from backends.caches.disk_prefixes import DiskPrefixes
from backends.caches.prefix_keys import BLOCK_TOKENS, block_names
from backends.caches.prefix_store import PrefixStore
from backends.engine import Engine, GenerationRequest
from backends.llamacpp.model import LlamaCppModel
from tests.runtimes.hybrid_helpers import (
    tiny_files,  # noqa: F401  (a fixture)
)
from tests.support.model_files import SMOLLM2_KEY, require_model

pytestmark = pytest.mark.real_model

CONTEXT = 2048
# Two whole blocks and a tail: the first engine saves 1,024 tokens.
PROMPT = [(i * 37) % 4000 + 200 for i in range(2 * BLOCK_TOKENS + 150)]
BUDGET = 1 << 30


def smollm2(*, exact: bool = True) -> LlamaCppModel:
    return LlamaCppModel(require_model(SMOLLM2_KEY), n_ctx=CONTEXT, exact_kernels=exact)


def run(
    engine: Engine, prompt: list[int], drafter: str = "none", max_tokens: int = 24
) -> tuple[list[int], int]:
    """Greedy reply tokens, and how many prompt tokens the reply did not read."""
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        max_tokens=max_tokens,
        drafter=drafter,
        draft_tokens=4,
        exact=True,
    )
    events = list(engine.generate(request))
    return [t for event in events for t in event.tokens], events[-1].stats.cached_prompt_tokens


def session(directory: Path, target: LlamaCppModel, draft: LlamaCppModel | None = None) -> Engine:
    return Engine(target, draft, prefixes=DiskPrefixes(PrefixStore(directory, BUDGET)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A directory where a first engine (exact target, fast draft) read ``PROMPT``, and
    the reply it wrote."""
    directory = tmp_path_factory.mktemp("saved") / "prefixes"
    first = session(directory, smollm2(), smollm2(exact=False))
    reply, cached = run(first, PROMPT, drafter="model")
    first.close()  # waits for the writes
    assert cached == 0 and first.prefixes.stats().saved == 2
    return directory, reply


def test_a_reply_from_a_loaded_prefix_is_the_reply_from_reading_it(saved, tmp_path) -> None:
    directory, read = saved
    labels = sorted(entry.label for entry in PrefixStore(directory, BUDGET).entries())
    assert [label.rsplit(" ", 1)[1] for label in labels] == ["(draft)", "(target)"]
    copy = tmp_path / "prefixes"
    shutil.copytree(directory, copy)

    second = session(copy, smollm2(), smollm2(exact=False))
    loaded, cached = run(second, PROMPT, drafter="model")
    stats = second.prefixes.stats()
    second.close()
    assert stats.loaded == 2  # the target's state and the draft's
    assert cached == 2 * BLOCK_TOKENS
    assert loaded == read

    # Another session's question, sharing the first block and a little more: under exact
    # kernels the target loads the whole block only (the rest is read as from the start).
    other = PROMPT[: BLOCK_TOKENS + 100] + [(i * 13) % 3000 + 300 for i in range(300)]
    third = session(copy, smollm2())
    _, cached = run(third, other, max_tokens=1)
    third.close()
    assert cached == BLOCK_TOKENS


def test_fast_kernels_load_what_the_same_model_saved_and_cut_it_where_the_prompt_leaves(
    saved, tmp_path
) -> None:
    directory, _ = saved
    copy = tmp_path / "prefixes"
    shutil.copytree(directory, copy)
    prefixes = DiskPrefixes(PrefixStore(copy, BUDGET))
    exact, fast = smollm2(exact=True), smollm2(exact=False)
    # Exact kernels compute another state than the fast ones: never each other's.
    assert prefixes.key_for(exact) != prefixes.key_for(fast)
    exact.close()
    # The fast target is the model the draft was (same file, same kernels): it may
    # load the draft's state, cut back to all that the prompt shares with it.
    other = PROMPT[:700] + [(i * 11) % 3000 + 300 for i in range(40)]
    engine = Engine(fast, None, prefixes=prefixes)
    _, cached = run(engine, other, max_tokens=1)
    engine.close()
    assert cached == 700 and prefixes.stats().loaded == 1


def test_fast_kernels_save_where_the_prompt_ends_and_the_next_session_keeps_its_prefix(
    tmp_path,
) -> None:
    directory = tmp_path / "prefixes"
    first = session(directory, smollm2(exact=False))
    run(first, PROMPT, max_tokens=1)
    first.close()
    (entry,) = PrefixStore(directory, BUDGET).entries()
    assert entry.tokens == len(PROMPT) - 1  # not cut to a block: the tail is kept too
    # The next session asks another question at the end: all before it is loaded.
    question = PROMPT[:-30] + [(i * 17) % 3000 + 300 for i in range(30)]
    second = session(directory, smollm2(exact=False))
    _, cached = run(second, question, max_tokens=1)
    second.close()
    assert cached == len(PROMPT) - 30


def test_a_prompt_that_parts_early_from_a_longer_saved_one_is_saved_too(tmp_path) -> None:
    # An agent's system prompt with today's date in it: it parts from yesterday's saved
    # prompt inside its second block, though it ends within that prompt's length.
    directory = tmp_path / "prefixes"
    first = session(directory, smollm2(exact=False))
    run(first, PROMPT, max_tokens=1)
    first.close()
    today = PROMPT[:600] + [(i * 13) % 3000 + 300 for i in range(780)]
    assert len(PROMPT) < len(today) < len(PROMPT) + 256
    second = session(directory, smollm2(exact=False))
    _, cached = run(second, today, max_tokens=1)
    second.close()
    assert cached == 600
    assert second.prefixes.stats().saved == 1
    # The next session today loads all of it but the question at the end.
    question = today[:-30] + [(i * 19) % 3000 + 300 for i in range(30)]
    third = session(directory, smollm2(exact=False))
    _, cached = run(third, question, max_tokens=1)
    third.close()
    assert cached == len(today) - 30


def test_a_state_the_runtime_refuses_is_deleted_and_the_prompt_read(
    saved, tmp_path, caplog
) -> None:
    directory, read = saved
    copy = tmp_path / "prefixes"
    shutil.copytree(directory, copy)
    # Right key, right checksum, but not a state llama.cpp can restore (a file written
    # by a buggy or foreign program): the runtime refuses it, the cache is left empty.
    store = PrefixStore(copy, BUDGET)
    target = smollm2()
    prefixes = DiskPrefixes(store)
    key = prefixes.key_for(target)
    hit = store.find(key, block_names(key, PROMPT))
    assert hit is not None
    tokens, state = store.read(hit, key, target.read_state)
    garbage = bytes(len(state.payload))
    store.discard(hit.entry)
    assert store.write(
        key,
        "smollm2 (target)",
        tokens,
        block_names(key, tokens),
        cuttable=True,
        nbytes=len(garbage),
        encode=lambda file: file.write(garbage),
    )
    (bad,) = [entry.entry for entry in store.entries() if entry.label == "smollm2 (target)"]
    engine = Engine(target, None, prefixes=prefixes)
    with caplog.at_level(logging.WARNING):
        reply, cached = run(engine, PROMPT)
    engine.close()
    assert "refused a saved state" in caplog.text
    assert cached == 0 and reply == read
    # The bad file is gone; the state read instead was saved in its place.
    assert not (copy / f"{bad}.prefix").exists() and prefixes.stats().saved == 1


def test_a_hybrid_targets_checkpoint_loads_whole_and_writes_the_same_reply(
    tmp_path: Path,
    tiny_files: tuple[Path, Path],  # noqa: F811
) -> None:
    path, _ = tiny_files
    directory = tmp_path / "prefixes"
    first = session(directory, LlamaCppModel(path, n_ctx=CONTEXT))
    read, _ = run(first, PROMPT, max_tokens=16)
    first.close()
    (entry,) = PrefixStore(directory, BUDGET).entries()
    assert entry.tokens == 2 * BLOCK_TOKENS

    second = session(directory, LlamaCppModel(path, n_ctx=CONTEXT))
    loaded, cached = run(second, PROMPT, max_tokens=16)
    # A recurrent state cannot be cut back: a prompt that leaves the saved one inside
    # its second block does not load it.
    other = PROMPT[: BLOCK_TOKENS + 100] + [5] * 600
    _, cached_other = run(second, other, max_tokens=2)
    stats = second.prefixes.stats()
    second.close()
    assert cached == 2 * BLOCK_TOKENS and loaded == read
    assert cached_other < BLOCK_TOKENS and stats.loaded == 1
