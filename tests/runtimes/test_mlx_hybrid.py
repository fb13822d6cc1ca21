"""Hybrid targets speculate on MLX, exactly: rollback of a recurrent state by snapshot.

Tiny random-weight Qwen3.5 models built here with mlx-lm's own ``qwen3_5`` class (Gated
DeltaNet layers with an ``ArraysCache``, full attention every 2nd layer with a
``KVCache``) and SmolLM2's converted tokenizer: a target, and a draft model that is
the target with noise on its weights, so rounds accept some drafts and reject others.
mlx-lm cannot trim the DeltaNet state; backends/mlx/rollback.py restores a snapshot and
replays the accepted tokens. Greedy speculation must write exactly what plain decoding
writes, however deep the rollbacks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.base import ChatMessage
from backends.caches.conversation_cache import ConversationCache
from backends.engine import Engine, GenerationRequest
from tests.runtimes.hybrid_helpers import cut_back_a_batch, deepest_rejection, greedy
from tests.speculation.held_costs import HeldCosts

pytestmark = pytest.mark.real_model


CONTEXT = 1024
PROMPT = [ChatMessage("user", "Write a short poem about the sea, please.")]
# A verify costs about one decode here, as on a GPU: "auto" then drafts.
GPU_LIKE_COSTS = {1: 0.010, 2: 0.0102, 3: 0.0104, 4: 0.0106, 5: 0.0108, 8: 0.011, 16: 0.012}


def load(path: Path):  # -> MlxModel
    from backends.mlx.model import MlxModel

    return MlxModel(path, n_ctx=CONTEXT)


@pytest.fixture
def engine(tiny_dirs: tuple[Path, Path]) -> Iterator[Engine]:
    target, draft = tiny_dirs
    # Held as given: these tiny models' forwards would correct them to a CPU's figures
    # within the reply (cost_audit.py), and then what `auto` chooses follows the timing.
    costs = HeldCosts(dict(GPU_LIKE_COSTS), 0.001)
    engine = Engine(load(target), load(draft), costs=costs)
    yield engine
    engine.close()


def plain_tokens(path: Path, prompt: list[int], max_tokens: int = 60) -> list[int]:
    """What the target alone writes, from a fresh model (no rollback ever)."""
    fresh = Engine(load(path))
    try:
        return greedy(fresh, prompt, "none", max_tokens=max_tokens)[0]
    finally:
        fresh.close()


def test_mlx_loads_a_hybrid_model_and_reports_it_recurrent(tiny_dirs):
    from mlx_lm.models.cache import can_trim_prompt_cache

    model = load(tiny_dirs[0])
    try:
        assert model.recurrent
        assert model.rollback_limit == 16
        # mlx-lm alone cannot roll this cache back: what made the old loader refuse it.
        assert not can_trim_prompt_cache(model._cache)
    finally:
        model.close()


@pytest.mark.parametrize("drafter", ["ngram", "model", "auto"])
def test_greedy_speculation_on_a_hybrid_target_writes_what_plain_decoding_writes(
    engine: Engine, tiny_dirs, drafter: str
):
    prompt = engine.chat_prompt(PROMPT)
    plain = plain_tokens(tiny_dirs[0], prompt)
    speculative, events = greedy(engine, prompt, drafter)
    stats = events[-1].stats
    assert speculative == plain
    assert stats.drafted > stats.accepted > 0  # drafts were accepted, and some rejected
    assert deepest_rejection(events) >= 2  # a rollback deeper than one token


def test_a_hybrid_draft_model_is_rolled_back_by_its_snapshots(engine: Engine):
    """The draft is hybrid too: before each chain of one-token steps it keeps a
    snapshot, and the next round restores it and replays what the target accepted."""
    greedy(engine, engine.chat_prompt(PROMPT), "model", max_tokens=30)
    assert engine.draft._rollback.restores > 0
    assert engine.draft._rollback.replayed_tokens > 0
    assert engine.target._rollback.replayed_tokens > 0


def test_rollback_deeper_than_one_token_continues_like_plain_decoding(tiny_dirs):
    """Cut back 4 of a 6-token forward, and 3 of three one-token forwards: the next
    logits are those of plain decoding."""
    model = load(tiny_dirs[0])
    try:
        prompt, rest, reference = cut_back_a_batch(model)
        assert list(model.cached_tokens) == prompt + rest[:2]
        row = np.array(model.forward(rest[2:3])[0])
        np.testing.assert_allclose(row, reference[2], atol=1e-4)

        for token in rest[3:6]:
            model.forward([token])
        model.rollback(len(prompt) + 3)  # drop three one-token forwards
        row = np.array(model.forward(rest[3:4])[0])
        np.testing.assert_allclose(row, reference[3], atol=1e-4)
    finally:
        model.close()


def trim_only(self, tokens: list[int], n_keep: int) -> list[int]:
    """What mlx-lm offers alone: the attention layers trimmed, the DeltaNet state kept."""
    self._trim(len(tokens) - n_keep)
    del tokens[n_keep:]
    return []


def test_negative_control_without_restoring_the_recurrent_state_the_output_differs(
    tiny_dirs, monkeypatch
):
    from backends.mlx.rollback import RecurrentSnapshots

    monkeypatch.setattr(RecurrentSnapshots, "rollback", trim_only)
    model = load(tiny_dirs[0])
    try:
        _, rest, reference = cut_back_a_batch(model)
        row = np.array(model.forward(rest[2:3])[0])
        assert np.abs(row - reference[2]).max() > 0.1
    finally:
        model.close()
    engine = Engine(load(tiny_dirs[0]), load(tiny_dirs[1]))
    try:
        prompt = engine.chat_prompt(PROMPT)
        assert greedy(engine, prompt, "model")[0] != plain_tokens(tiny_dirs[0], prompt)
    finally:
        engine.close()


def test_a_new_prompt_sharing_the_last_prompt_resumes_from_its_snapshot(engine, tiny_dirs):
    """A prompt that shares the previous prompt but not its reply rolls the recurrent
    state back to the snapshot kept after that prompt was read."""
    first = engine.chat_prompt(PROMPT)
    greedy(engine, first, "model", max_tokens=20)
    second = [*first, *engine.target.tokenize(" And the moon", add_special=False)]
    tokens, events = greedy(engine, second, "model", max_tokens=30)
    assert events[-1].stats.cached_prompt_tokens == len(first) - 1
    assert tokens == plain_tokens(tiny_dirs[0], second, max_tokens=30)


def test_calibration_measures_a_hybrid_pair_and_leaves_the_caches_empty(engine):
    costs = engine.calibrate()
    assert costs.target_seconds[1] > 0 and costs.draft_step_seconds
    assert list(engine.target.cached_tokens) == []
    assert list(engine.draft.cached_tokens) == []


def test_a_kept_hybrid_conversation_is_restored_whole(tiny_dirs):
    target_path, draft_path = tiny_dirs
    engine = Engine(load(target_path), load(draft_path), conversations=ConversationCache(64 << 20))
    try:
        sea = engine.chat_prompt(PROMPT)
        sea_tokens, _ = greedy(engine, sea, "model", max_tokens=16)
        other = engine.chat_prompt([ChatMessage("user", "List three colours of autumn.")])
        greedy(engine, other, "model", max_tokens=16)  # the sea conversation is kept
        follow_up = [*sea, *sea_tokens, *engine.target.tokenize("\nMore.", add_special=False)]
        tokens, events = greedy(engine, follow_up, "model", max_tokens=20)
        assert engine.conversations.stats().restored >= 1
        assert events[-1].stats.cached_prompt_tokens >= len(sea)
        assert tokens == plain_tokens(target_path, follow_up, max_tokens=20)
    finally:
        engine.close()


def test_mtp_drafting_on_mlx_still_says_it_is_unsupported(engine):
    from backends.errors import BackendError

    with pytest.raises(BackendError, match="cannot draft with a model's MTP head here"):
        engine.drafter_named("mtp")


def test_sliding_window_layers_beside_recurrent_ones_are_still_refused():
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    from backends.mlx.rollback import untrimmable_cache_reason

    kinds = {"sliding": RotatingKVCache, "recurrent": ArraysCache}
    assert untrimmable_cache_reason([ArraysCache(2), KVCache()], **kinds) is None
    reason = untrimmable_cache_reason([ArraysCache(2), RotatingKVCache(8)], **kinds)
    assert reason == "1 of its 2 layers use a sliding-window cache"


def test_sampled_speculation_on_a_hybrid_target_is_reproducible(engine: Engine):
    """At temperature 0.7 with a seed, rounds are rolled back and replayed the same way
    each time: the same reply twice."""
    from backends.sampling.filters import SamplingParams

    prompt = engine.chat_prompt(PROMPT)
    replies = []
    for _ in range(2):
        request = GenerationRequest(
            prompt_tokens=tuple(prompt),
            max_tokens=40,
            drafter="model",
            draft_tokens=4,
            params=SamplingParams(temperature=0.7, seed=3),
        )
        events = list(engine.generate(request))
        replies.append([token for event in events for token in event.tokens])
        assert events[-1].stats.drafted > events[-1].stats.accepted
    assert replies[0] == replies[1]
