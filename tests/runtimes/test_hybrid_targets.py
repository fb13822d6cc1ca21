"""Hybrid targets speculate, exactly: rollback of a recurrent state on llama.cpp.

Tiny random-weight ``qwen35`` models (Gated DeltaNet + attention, written by
tests/support/tiny_hybrid.py with SmolLM2's tokenizer): a target, and a draft model that is
the target with noise on its weights, so rounds accept some drafts and reject others.
A recurrent state cannot be cut back like a KV cache; backends/llamacpp/rollback.py
does it with llama.cpp's snapshots, checkpoints and replay. Greedy speculation must
write exactly what plain decoding writes, whatever had to be rolled back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backends.base import ChatMessage
from backends.caches.conversation_cache import ConversationCache
from backends.engine import Engine
from backends.errors import DecodeError
from backends.generation_events import SpeculativeStats
from tests.runtimes.hybrid_helpers import (
    CONTEXT,
    cut_back_a_batch,
    deepest_rejection,
    greedy,
    llamacpp,
    load,
)
from tests.support.model_files import SMOLLM2_KEY, require_model

pytestmark = pytest.mark.real_model


REPO = Path(__file__).resolve().parents[2]
PROMPT = [ChatMessage("user", "Write a short poem about the sea, please.")]


def plain_tokens(path: Path, prompt: list[int], max_tokens: int = 60) -> list[int]:
    """What the target alone writes, from a fresh model (no rollback ever)."""
    fresh = Engine(load(path))
    try:
        return greedy(fresh, prompt, "none", max_tokens=max_tokens)[0]
    finally:
        fresh.close()


def test_llama_cpp_reports_the_tiny_model_as_hybrid(tiny_files):
    model = load(tiny_files[0])
    try:
        assert model.recurrent
        assert model.rollback_limit == llamacpp.DEFAULT_SNAPSHOTS
    finally:
        model.close()


@pytest.mark.parametrize("drafter", ["ngram", "model", "auto"])
def test_greedy_speculation_on_a_hybrid_target_writes_what_plain_decoding_writes(
    engine: Engine, tiny_files, drafter: str
):
    prompt = engine.chat_prompt(PROMPT)
    plain = plain_tokens(tiny_files[0], prompt)
    speculative, events = greedy(engine, prompt, drafter)
    stats: SpeculativeStats = events[-1].stats
    assert speculative == plain
    assert stats.drafted > stats.accepted > 0  # drafts were accepted, and some rejected
    assert deepest_rejection(events) >= 2  # a rollback deeper than one token


def test_a_hybrid_draft_model_drafts_for_a_kv_cache_target(tiny_files):
    """SmolLM2 (a KV cache) with the tiny hybrid as its draft: same tokenizer, so they
    pair; the draft's chains are undone by checkpoint and replay every round."""
    engine = Engine(load(require_model(SMOLLM2_KEY)), load(tiny_files[1]))
    try:
        prompt = engine.chat_prompt(PROMPT)
        plain, _ = greedy(engine, prompt, "none", max_tokens=30)
        tokens, events = greedy(engine, prompt, "model", max_tokens=30)
        assert tokens == plain
        assert events[-1].stats.drafted > 0
        assert engine.draft._recurrent.restores > 0
    finally:
        engine.close()


def test_a_hybrid_target_without_snapshots_speculates_by_checkpoint_and_replay(tiny_files):
    """Where llama.cpp has no snapshots for an architecture (qwen3next, Mamba), every
    verify is preceded by a copy of the state; a partial acceptance restores it and
    replays the accepted tokens."""
    target_path, draft_path = tiny_files
    target = load(target_path, rollback_snapshots=0)
    engine = Engine(target, load(draft_path, rollback_snapshots=0))
    try:
        assert target.rollback_limit is None
        prompt = engine.chat_prompt(PROMPT)
        speculative, events = greedy(engine, prompt, "model")
        assert speculative == plain_tokens(target_path, prompt)
        assert deepest_rejection(events) >= 2
        assert target._recurrent.replayed_tokens > 0
    finally:
        engine.close()


@pytest.mark.parametrize("snapshots", [16, 0])
def test_rollback_deeper_than_one_token_continues_like_plain_decoding(tiny_files, snapshots):
    """Cut back 4 of a 6-token forward, and 3 of three one-token forwards: the next
    logits are those of plain decoding (to rounding: batch kernels add up differently)."""
    model = load(tiny_files[0], rollback_snapshots=snapshots)
    try:
        prompt, rest, reference = cut_back_a_batch(model)
        assert list(model.cached_tokens) == prompt + rest[:2]
        row = np.array(model.forward(rest[2:3])[0])
        np.testing.assert_allclose(row, reference[2], atol=2e-2)
        assert row.argmax() == reference[2].argmax()

        for token in rest[3:6]:
            model.forward([token])
        model.rollback(len(prompt) + 3)  # drop three one-token forwards
        row = np.array(model.forward(rest[3:4])[0])
        np.testing.assert_allclose(row, reference[3], atol=2e-2)
    finally:
        model.close()


def naive_rollback(self, n_keep: int) -> None:
    """What the runtime offers alone: llama.cpp's seq_rm, trusted blindly."""
    import llama_cpp

    if not llama_cpp.llama_memory_seq_rm(self._memory, 0, n_keep, -1):
        raise DecodeError(f"llama.cpp could not drop cached positions from {n_keep} on")
    self.physical = n_keep


def test_negative_control_snapshots_alone_silently_corrupt_the_state(tiny_files, monkeypatch):
    """Without tracking how far the snapshots reach, llama.cpp accepts a rollback past
    the last decode and continues from a stale state: the test above then fails."""
    monkeypatch.setattr(llamacpp.RecurrentRollback, "rollback", naive_rollback)
    model = load(tiny_files[0])
    try:
        tokens = model.tokenize("The sea is wide and the waves are high, the wind is strong")
        prompt, rest = tokens[:8], tokens[8:]
        model.prefill(prompt)
        reference = [np.array(model.forward([token])[0]) for token in rest[:4]]
        model.rollback(len(prompt) + 2)  # the last decode was one token: no snapshot reaches
        row = np.array(model.forward(rest[2:3])[0])
        assert np.abs(row - reference[2]).max() > 1.0
    finally:
        model.close()


def test_negative_control_without_rollback_speculation_fails_as_before(tiny_files, monkeypatch):
    """The state this issue started from: no snapshots, no replay, llama.cpp refuses."""
    monkeypatch.setattr(llamacpp.RecurrentRollback, "rollback", naive_rollback)
    target_path, draft_path = tiny_files
    engine = Engine(load(target_path, rollback_snapshots=0), load(draft_path))
    try:
        with pytest.raises(DecodeError, match="could not drop cached positions"):
            greedy(engine, engine.chat_prompt(PROMPT), "model")
    finally:
        engine.close()


def test_a_new_prompt_sharing_the_last_prompt_resumes_from_its_checkpoint(engine, tiny_files):
    """The engine's prompt reuse: a prompt that shares the previous prompt but not its
    reply rolls the recurrent state back to the checkpoint kept after that prompt."""
    first = engine.chat_prompt(PROMPT)
    greedy(engine, first, "model", max_tokens=20)
    second = [*first, *engine.target.tokenize(" And the moon", add_special=False)]
    tokens, events = greedy(engine, second, "model", max_tokens=30)
    assert events[-1].stats.cached_prompt_tokens == len(first) - 1
    assert tokens == plain_tokens(tiny_files[0], second, max_tokens=30)


def test_calibration_measures_a_hybrid_pair_and_leaves_the_caches_empty(engine):
    costs = engine.calibrate()
    assert costs.target_seconds[1] > 0 and costs.draft_step_seconds
    # Batched Gated DeltaNet kernels add up differently from the one-token ones.
    assert costs.exact_batch_limit is not None and costs.exact_batch_limit >= 1
    assert list(engine.target.cached_tokens) == []
    assert list(engine.draft.cached_tokens) == []


def test_a_kept_hybrid_conversation_is_restored_whole(tiny_files):
    target_path, draft_path = tiny_files
    engine = Engine(
        load(target_path),
        load(draft_path),
        conversations=ConversationCache(64 << 20),
    )
    try:
        sea = engine.chat_prompt(PROMPT)
        sea_tokens, _ = greedy(engine, sea, "model", max_tokens=16)
        other = engine.chat_prompt([ChatMessage("user", "List three colours of autumn.")])
        greedy(engine, other, "model", max_tokens=16)  # the sea conversation is kept
        follow_up = [*sea, *sea_tokens, *engine.target.tokenize("\nMore.", add_special=False)]
        tokens, events = greedy(engine, follow_up, "model", max_tokens=20)
        cache = engine.conversations.stats()
        assert cache.restored >= 1
        assert events[-1].stats.cached_prompt_tokens >= len(sea)
        assert tokens == plain_tokens(target_path, follow_up, max_tokens=20)
    finally:
        engine.close()


def test_a_kept_hybrid_state_longer_than_the_prompt_is_not_restored(tiny_files):
    """A recurrent state cannot be cut to a shorter prefix: restoring it would only
    mean reading everything again, so the cache does not."""
    model = load(tiny_files[0])
    cache = ConversationCache(64 << 20)
    try:
        tokens = model.tokenize("one two three four five six seven eight nine ten eleven twelve")
        model.prefill(tokens)
        kept = list(model.cached_tokens)
        cache.prepare("target", model, [*tokens[:2], 7, 7, 7])  # keeps the live state
        model.rollback(0)
        assert cache.prepare("target", model, kept[:-3]) == 0
        assert cache.stats().restored == 0
        assert cache.prepare("target", model, [*kept, 5]) == len(kept)
        assert cache.stats().restored == 1
    finally:
        model.close()


@pytest.mark.parametrize("drafter", ["model", "ngram", "auto"])
def test_generate_runs_a_hybrid_target_with_every_drafter(tiny_files, drafter, tmp_path):
    """``draftpen generate --target tiny.gguf`` as a user runs it (auto calibrates)."""
    target, draft = tiny_files
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.main",
            "generate",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--drafter",
            drafter,
            "--context",
            str(CONTEXT),
            "--max-tokens",
            "24",
            "--prompt",
            "Write a short poem about the sea, please.",
            "--json",
        ],
        cwd=REPO,
        env={**os.environ, "DRAFTPEN_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["stats"]["generated_tokens"] == 24
