"""EAGLE-3 and DFlash heads drafting for a parallel MLX model: several sequences at once,
each drafting with a head state of its own, fed its own rows of the batched forwards.

The real views, batcher, exchange thread and slots (as tests/runtimes/test_mlx_parallel.py
drives them), over a tiny random-weight llama with heads written for it
(tests/support/tiny_mlx_heads.py), on MLX's CPU build. Random heads guess poorly, so
rounds reject and roll back each sequence's head beside the others'; exactness is
checked against each prompt's plain reply alone, and that no sequence's head read
another's rows is checked directly: after a reply its rows are a fresh head's that read
the same context alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.engine_slots import EngineSlots
from backends.runtime_exchange import RuntimeExchange
from backends.sampling.filters import SamplingParams
from backends.speculation.cost_model import CostModel
from tests.support.slot_runs import reply_tokens, run_on_slots, serving_exchange
from tests.support.tiny_mlx_heads import (
    DFLASH_BLOCK,
    write_dflash_head,
    write_eagle3_head,
    write_mlx_target,
)

pytest.importorskip("mlx_vlm")
pytestmark = pytest.mark.real_model

CONTEXT = 512
MAX_TOKENS = 30
PROMPTS = (
    "def fibonacci(n):\n",
    "Once upon a time, in a village by the sea, there lived",
    "The capital of France is",
)
HEADS = [("llama-eagle3", "eagle3"), ("llama-dflash", "dflash")]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny target, an EAGLE-3 head with a vocabulary of its own (d2t) and a DFlash head."""
    folder = tmp_path_factory.mktemp("tiny-mlx-parallel-heads")
    return {
        "llama": write_mlx_target(folder / "llama", seed=1),
        "llama-eagle3": write_eagle3_head(folder / "llama-eagle3", seed=2, draft_vocab=1000),
        "llama-dflash": write_dflash_head(folder / "llama-dflash", seed=2),
    }


def _engine(files: dict[str, Path], head: str | None, parallel: int) -> Engine:
    from backends.mlx.model import MlxModel

    target = MlxModel(files["llama"], n_ctx=CONTEXT, parallel=parallel, exact_output=True)
    engine = Engine(target)
    if head is not None:  # attached to the loaded model, before its views are made
        if "eagle3" in head:
            engine.attach_eagle3_head(files[head])
        else:
            engine.attach_dflash_head(files[head])
    # As calibrated on a CPU where batches up to 32 rows round like one-token decoding
    # (MLX's CPU rounds a gathered forward as alone): rounds share forwards.
    engine.costs = CostModel({1: 0.01, 8: 0.02}, 0.005, exact_batch_limit=32)
    return engine


def _request(engine: Engine, prompt: str, drafter: str) -> GenerationRequest:
    return GenerationRequest(
        tuple(engine.text_prompt(prompt)),
        params=SamplingParams(temperature=0.0),
        max_tokens=MAX_TOKENS,
        drafter=drafter,
        draft_tokens=4,
        exact=True,
    )


@pytest.fixture(scope="module")
def alone(files: dict[str, Path]) -> dict[str, list[int]]:
    """Each prompt's greedy reply from plain decoding on a model of one sequence."""
    engine = _engine(files, None, 1)
    try:
        return {
            prompt: [
                token
                for event in engine.generate(_request(engine, prompt, "none"))
                for token in event.tokens
            ]
            for prompt in PROMPTS
        }
    finally:
        engine.close()


@pytest.fixture(params=HEADS, ids=[drafter for _, drafter in HEADS])
def served(files: dict[str, Path], request: pytest.FixtureRequest) -> Iterator[Any]:
    """A parallel engine with a head, its slots, and a runtime thread serving them."""
    head, drafter = request.param
    with serving_exchange() as exchange:
        engine = _engine(files, head, len(PROMPTS))
        slots = EngineSlots(engine, exchange)
        yield engine, slots, head, drafter
    slots.close()
    engine.close()


def _run_together(
    slots: EngineSlots, engine: Engine, prompts: tuple[str, ...], drafter: str
) -> dict[str, tuple[Engine, list[int], list[Any]]]:
    """Each prompt's slot, reply and events, generated at once on the slots."""
    done = run_on_slots(slots, {prompt: _request(engine, prompt, drafter) for prompt in prompts})
    return {
        str(prompt): (slot, reply_tokens(events), events) for prompt, (slot, events) in done.items()
    }


def _head_rows(head: Any, drafter: str, context: list[int], evaluated: int) -> np.ndarray:
    """The head's rows for its next round after ``context[:evaluated]``."""
    if drafter == "eagle3":
        rows = head.start(evaluated, context)
    else:
        rows = head.draft_block(evaluated, context, DFLASH_BLOCK - 1)
    assert rows is not None
    values = np.array([rows.row(index) for index in range(len(rows))])
    head.finish()
    return values


def test_each_sequence_drafts_with_its_own_head_and_writes_its_plain_reply_alone(
    served: Any, alone: dict[str, list[int]]
) -> None:
    engine, slots, _, drafter = served
    replies = _run_together(slots, engine, PROMPTS, drafter)
    for prompt in PROMPTS:
        slot, reply, events = replies[prompt]
        assert reply == alone[prompt]
        assert len(set(reply)) > 5  # many tokens, not one repeated: the check bites
        # This slot drafted with the head, through its own sequence's state of it.
        assert any(event.drafter == drafter and event.draft_length > 0 for event in events)
        assert slot.target.sequence_head().decodes > 0  # type: ignore[attr-defined]
    assert len({tuple(reply) for _, reply, _ in replies.values()}) == len(PROMPTS)
    batcher = slots._target_views.batcher
    if batcher.batch_exact:  # measured on the loaded model (MLX's CPU: exact)
        assert batcher.gathered > 0, "rounds shared forwards: heads read rows of a batch"
    # The slots again, each now holding another prompt's context: every sequence's
    # head is cut back with its target, and the replies are still their plain ones.
    again = _run_together(slots, engine, PROMPTS[::-1], drafter)
    assert {prompt: reply for prompt, (_, reply, _) in again.items()} == alone


def test_after_replies_side_by_side_each_head_reads_what_a_fresh_one_alone_would(
    served: Any, files: dict[str, Path]
) -> None:
    """Three sequences' heads fed from shared forwards, rounds rejected and cut back:
    each one's rows for its next round are those of a one-sequence model's head that
    read that sequence's context in one go (no row of another sequence among them)."""
    engine, slots, head, drafter = served
    replies = _run_together(slots, engine, PROMPTS, drafter)
    followed_rows = []
    for prompt in PROMPTS:
        slot, reply, events = replies[prompt]
        assert events[-1].stats.drafted > events[-1].stats.accepted  # rejections happened
        context = list(slot.target.cached_tokens)
        pending = [*context, reply[-1]]
        followed = _head_rows(slot.target.sequence_head(), drafter, pending, len(context))
        fresh = _engine(files, head, 1)
        try:
            fresh.target.prefill(context)
            head_alone = fresh.target._head  # type: ignore[attr-defined]
            read_at_once = _head_rows(head_alone, drafter, pending, len(context))
        finally:
            fresh.close()
        assert followed.shape == read_at_once.shape
        np.testing.assert_allclose(followed, read_at_once, rtol=1e-3, atol=1e-3)
        assert np.array_equal(followed.argmax(axis=-1), read_at_once.argmax(axis=-1))
        followed_rows.append(followed)
    # The sequences' contexts differ, and so do their heads' rows.
    assert not np.allclose(followed_rows[0], followed_rows[1], atol=1e-3)


def test_each_view_of_a_model_with_a_head_has_a_state_of_its_own(files: dict[str, Path]) -> None:
    from backends.mlx.sequences import sequence_views

    with serving_exchange() as exchange:
        engine = _engine(files, "llama-dflash", 2)
        views = sequence_views(engine.target, exchange)  # type: ignore[arg-type]
        try:
            _check_states_of_their_own(engine, views, exchange)
        finally:
            views.close()
    engine.close()


def _check_states_of_their_own(engine: Engine, views: Any, exchange: RuntimeExchange) -> None:
    """Two views' head states over one loaded head: each reads its own view's rows, a
    rollback is noted and made on the runtime thread, a restored state starts afresh."""
    heads = [view.sequence_head() for view in views.views]
    assert heads[0] is not None and heads[1] is not None
    assert heads[0].head is not heads[1].head
    owner = engine.target._head  # type: ignore[attr-defined]
    assert heads[0].head.model is owner.model  # the weights are loaded once
    assert heads[0].kind == "dflash" and heads[0].max_drafts == DFLASH_BLOCK - 1
    views.views[0].prefill(engine.text_prompt(PROMPTS[0]))
    assert heads[0].head._kept.end > 0 and heads[1].head._kept.end == 0
    views.views[0].rollback(2)  # noted here, made on the runtime thread's next work
    assert heads[0].head._kept.end > 2
    exchange.call(heads[0]._caught_up)
    assert heads[0].head._kept.end == 2
    views.views[0].prefill(engine.text_prompt(PROMPTS[1])[:3])
    assert heads[0].head._kept.end == 5
    # A state restored whole: the head's rows start afresh from the next forward's.
    views.views[0].restore_state(views.views[0].save_state())
    exchange.call(heads[0]._caught_up)
    assert heads[0].head._kept.end == 0
    views.views[0].prefill([7, 8])
    assert (heads[0].head._kept.start, heads[0].head._kept.end) == (5, 7)
    assert heads[1].head._kept.end == 0  # the other view's head read none of it
