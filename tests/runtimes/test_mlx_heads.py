"""EAGLE-3 and DFlash heads on MLX (issue 54 part 8): mlx-vlm's head models, fed by the
target's captured layers and kept in step with its cache by draftpen, drafting exactly.

Tiny random-weight llama and qwen3 targets with heads written for them in their
publishers' formats (tests/support/tiny_mlx_heads.py), on MLX's CPU build. Random weights
make the heads poor guessers, so most drafts are rejected and every round exercises the
head's rollback; exactness does not depend on the weights, and that the head followed
the target is checked directly: after a reply full of rejections its rows are a fresh
head's that read the same context at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.errors import BackendError, ModelLoadError
from backends.sampling.filters import SamplingParams
from tests.support.draft_distribution import check_head_drafts_are_exact
from tests.support.tiny_mlx_heads import (
    DFLASH_BLOCK,
    write_dflash_head,
    write_eagle3_head,
    write_mlx_target,
)

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.real_model

CONTEXT = 1024
PROMPT = [ChatMessage("user", "Write a short poem about the sea, please.")]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny targets and the heads written for them (and for another target)."""
    folder = tmp_path_factory.mktemp("tiny-mlx-heads")
    return {
        "llama": write_mlx_target(folder / "llama", seed=1),
        "qwen3": write_mlx_target(folder / "qwen3", seed=3, arch="qwen3"),
        "peaked": write_mlx_target(folder / "peaked", seed=5, arch="qwen3", common_direction=True),
        # A vocabulary of its own (1,000 ids) mapped onto the target's by d2t.
        "llama-eagle3": write_eagle3_head(folder / "llama-eagle3", seed=2, draft_vocab=1000),
        "qwen3-eagle3": write_eagle3_head(folder / "qwen3-eagle3", seed=4),
        "llama-dflash": write_dflash_head(folder / "llama-dflash", seed=2),
        "qwen3-dflash": write_dflash_head(folder / "qwen3-dflash", seed=4),
        "narrow-eagle3": write_eagle3_head(folder / "narrow-eagle3", seed=6, hidden=32),
        "narrow-dflash": write_dflash_head(folder / "narrow-dflash", seed=6, hidden=32),
    }


def mlx_engine(target: Path, head: Path | None = None, **load: object) -> Engine:
    from backends.mlx.model import MlxModel

    engine = Engine(MlxModel(target, n_ctx=CONTEXT, **load))  # type: ignore[arg-type]
    if head is not None:
        if "eagle3" in head.name:
            engine.attach_eagle3_head(head)
        else:
            engine.attach_dflash_head(head)
    return engine


@pytest.fixture
def llama_engine(files) -> Iterator[Engine]:
    engine = mlx_engine(files["llama"])
    yield engine
    engine.close()


def generate(
    engine: Engine, drafter: str, *, params: SamplingParams | None = None, max_tokens: int = 40
) -> tuple[list[int], list]:
    request = GenerationRequest(
        prompt_tokens=tuple(engine.chat_prompt(PROMPT)),
        max_tokens=max_tokens,
        drafter=drafter,
        draft_tokens=4,
        params=params or SamplingParams(),
        exact=True,
    )
    events = list(engine.generate(request))
    return [token for event in events for token in event.tokens], events


HEADED = [
    ("llama", "llama-eagle3", "eagle3"),
    ("qwen3", "qwen3-eagle3", "eagle3"),
    ("llama", "llama-dflash", "dflash"),
    ("qwen3", "qwen3-dflash", "dflash"),
]


@pytest.mark.parametrize(("target", "head", "drafter"), HEADED)
def test_greedy_head_speculation_on_mlx_writes_what_plain_decoding_writes(
    files, target, head, drafter
):
    plain_engine = mlx_engine(files[target])
    try:
        plain, _ = generate(plain_engine, "none")
    finally:
        plain_engine.close()
    assert len(set(plain)) > 5  # a reply of many tokens, not one repeated: the check bites
    engine = mlx_engine(files[target], files[head])
    try:
        drafted, events = generate(engine, drafter)
        assert drafted == plain
        assert events[-1].stats.drafted > 0
        assert any(event.drafter == drafter for event in events)
        assert engine.target._head.decodes > 0  # type: ignore[attr-defined]
    finally:
        engine.close()


def _head_rows(engine: Engine, drafter: str, context: list[int], evaluated: int) -> np.ndarray:
    head = engine.target._head  # type: ignore[attr-defined]
    if drafter == "eagle3":
        rows = head.start(evaluated, context)
    else:
        rows = head.draft_block(evaluated, context, DFLASH_BLOCK - 1)
    assert rows is not None
    values = np.array([rows.row(index) for index in range(len(rows))])
    head.finish()
    return values


@pytest.mark.parametrize(("target", "head", "drafter"), [HEADED[0], HEADED[2]])
def test_after_a_reply_full_of_rejections_the_head_reads_what_a_fresh_one_would(
    files, target, head, drafter
):
    """Rounds of drafts rejected and cut back leave the head's cache holding what the
    target accepted: its rows for the next round are those of a head that read the
    target's whole context in one go."""
    engine = mlx_engine(files[target], files[head])
    fresh = mlx_engine(files[target], files[head])
    try:
        reply, events = generate(engine, drafter, max_tokens=30)
        assert events[-1].stats.drafted > events[-1].stats.accepted  # rejections happened
        context = list(engine.target.cached_tokens)
        evaluated = len(context)
        pending = [*context, reply[-1]]
        followed = _head_rows(engine, drafter, pending, evaluated)
        fresh.target.prefill(context)
        read_at_once = _head_rows(fresh, drafter, pending, evaluated)
        assert followed.shape == read_at_once.shape
        np.testing.assert_allclose(followed, read_at_once, rtol=1e-3, atol=1e-3)
        assert np.array_equal(followed.argmax(axis=-1), read_at_once.argmax(axis=-1))
    finally:
        engine.close()
        fresh.close()


@pytest.mark.parametrize(
    ("head", "slot"), [("qwen3-eagle3", 0), ("qwen3-dflash", 0), ("qwen3-dflash", 2)]
)
def test_head_drafts_on_mlx_are_distributed_as_q_and_verified_tokens_as_p(files, head, slot):
    engine = mlx_engine(files["peaked"], files[head])
    try:
        check_head_drafts_are_exact(
            engine,
            "eagle3" if "eagle3" in head else "dflash",
            engine.chat_prompt(PROMPT),
            slot=slot,
            temperature=3.0,
            support=16,
            samples=1500,
        )
    finally:
        engine.close()


@pytest.mark.parametrize("head", ["llama-eagle3", "llama-dflash"])
def test_after_the_targets_cache_is_restored_whole_the_head_drafts_again_exactly(files, head):
    """A conversation's saved cache restored (the head's rows for it are gone): the head
    starts afresh from the next rows the target evaluates, and the reply is the same."""
    drafter = "eagle3" if "eagle3" in head else "dflash"
    plain_engine = mlx_engine(files["llama"])
    try:
        plain, _ = generate(plain_engine, "none")
    finally:
        plain_engine.close()
    engine = mlx_engine(files["llama"], files[head])
    try:
        prompt = engine.chat_prompt(PROMPT)
        engine.target.prefill(prompt[:-1])
        saved = engine.target.save_state()
        engine.target.rollback(0)
        engine.target.restore_state(saved)
        drafted, events = generate(engine, drafter)
        assert events[-1].stats.cached_prompt_tokens == len(prompt) - 1
        assert drafted == plain
        assert events[-1].stats.drafted > 0
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("head", "attach", "message"),
    [
        ("narrow-eagle3", "attach_eagle3_head", "hidden size 32, the target's is 64"),
        ("narrow-dflash", "attach_dflash_head", "hidden size 32, the target's is 64"),
        ("llama-dflash", "attach_eagle3_head", "is a DFlash head, not an EAGLE-3 head"),
        ("llama-eagle3", "attach_dflash_head", "is an EAGLE-3 head, not a DFlash head"),
    ],
)
def test_a_head_that_does_not_fit_the_target_is_refused_saying_why(
    files, llama_engine, head, attach, message
):
    with pytest.raises(BackendError, match=message):
        getattr(llama_engine, attach)(files[head])
    with pytest.raises(BackendError, match="has no"):
        llama_engine.drafter_named("eagle3")


def test_a_head_for_another_vocabulary_or_layers_is_refused(files, llama_engine, tmp_path):
    other = write_eagle3_head(tmp_path / "eagle3-layers", seed=7, layers=(1, 2, 9))
    with pytest.raises(BackendError, match=r"it reads layers \[8\], the target has 4"):
        llama_engine.attach_eagle3_head(other)
    vocab = tmp_path / "dflash-vocab"
    write_dflash_head(vocab, seed=7)
    config = json.loads((vocab / "config.json").read_text())
    config["vocab_size"] = 32000
    (vocab / "config.json").write_text(json.dumps(config))
    with pytest.raises(BackendError, match="vocabulary of 32000 tokens, the target's has 49152"):
        llama_engine.attach_dflash_head(vocab)


def test_a_gguf_a_dspark_head_and_mtp_are_refused_on_mlx(files, llama_engine, tmp_path):
    gguf = tmp_path / "head.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        llama_engine.attach_eagle3_head(gguf)
    dspark = tmp_path / "dspark"
    write_dflash_head(dspark, seed=8)
    config = json.loads((dspark / "config.json").read_text())
    config["dspark_config"] = {"markov_rank": 8}
    (dspark / "config.json").write_text(json.dumps(config))
    with pytest.raises(BackendError, match="DSpark head: on MLX draftpen drafts with EAGLE-3"):
        llama_engine.attach_dflash_head(dspark)
    with pytest.raises(BackendError, match="cannot draft with a model's MTP head"):
        llama_engine.drafter_named("mtp")


def test_a_head_attaches_to_a_model_of_several_sequences(files):
    """Loaded once; each sequence's view drafts with a state of it of its own
    (tests/runtimes/test_mlx_parallel_heads.py drives them)."""
    from backends.mlx.model import MlxModel

    model = MlxModel(files["llama"], n_ctx=CONTEXT, parallel=2)
    try:
        head = model.attach_eagle3_file(files["llama-eagle3"])
        assert model.parallel == 2 and model._head is head
        sequence = head.for_sequence()
        assert sequence.model is head.model and sequence._cache is not head._cache
    finally:
        model.close()


def test_a_head_is_refused_for_a_target_split_across_ranks(files):
    """A share of a split target holds some of the layers a head reads (a group of one
    rank stands in for the ring: the refusal comes before any layer is read)."""
    import mlx.core as mx

    from backends.mlx.distributed import SplitMlxModel

    share = SplitMlxModel(files["llama"], mx.distributed.init(), n_ctx=CONTEXT)
    try:
        with pytest.raises(BackendError, match="split across machines, and a DFlash head"):
            share.attach_dflash_file(files["llama-dflash"])
    finally:
        share.close()


@pytest.mark.parametrize(
    ("head", "drafter"), [("llama-eagle3", "eagle3"), ("llama-dflash", "dflash")]
)
def test_on_the_device_sampling_path_heads_draft_exactly_too(files, head, drafter):
    """Apple Silicon samples on the device (MlxRows): the head's rows, an EAGLE-3 head's
    scattered from its own vocabulary, are read there as the target's are."""
    plain_engine = mlx_engine(files["llama"], device_sampling=True)
    try:
        plain, _ = generate(plain_engine, "none")
    finally:
        plain_engine.close()
    engine = mlx_engine(files["llama"], files[head], device_sampling=True)
    try:
        drafted, events = generate(engine, drafter)
        assert drafted == plain and events[-1].stats.drafted > 0
        sampled, events = generate(
            engine, drafter, params=SamplingParams(temperature=0.8, top_k=20, seed=3)
        )
        assert len(sampled) == 40 and events[-1].stats.drafted > 0
    finally:
        engine.close()
