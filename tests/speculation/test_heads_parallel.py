"""EAGLE-3 and DFlash heads on a llama.cpp target of several sequences (``--parallel``):
each sequence drafts with a head state of its own, fed from the batched decodes' rows.

The real views, decode batcher, runtime exchange and slots, with their threads, over the
tiny random-weight targets and heads the tests write (tests/support/tiny_eagle3.py,
tiny_dflash.py). Random weights reject most drafts, so every sequence's head is rolled
back round after round beside the others'.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.engine_slots import EngineSlots
from backends.runtime_exchange import RuntimeExchange
from backends.sampling.filters import SamplingParams
from backends.speculation.cost_model import CostModel
from tests.support.draft_distribution import check_head_drafts_are_exact
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.slot_runs import (
    greedy_chat_request,
    head_rows,
    record_shared_decodes,
    reply_tokens,
    run_on_slots,
    serving_exchange,
)
from tests.support.tiny_dflash import write_dflash_head
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target

pytestmark = pytest.mark.real_model

llamacpp = pytest.importorskip("backends.llamacpp.model")
LlamaCppModel = llamacpp.LlamaCppModel

CONTEXT = 512
MAX_TOKENS = 24
PROMPTS = (
    "Write a short poem about the sea, please.",
    "List three prime numbers and say why each is prime.",
    "What is the capital of France?",
)
# drafter name -> (the engine's attach method, the head file's key)
HEADS = {"eagle3": ("attach_eagle3_head", "eagle3"), "dflash": ("attach_dflash_head", "dflash")}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tokenizer = require_model(SMOLLM2_KEY)
    folder = tmp_path_factory.mktemp("heads-parallel")
    target = write_tiny_target(folder / "tiny-llama.gguf", tokenizer, seed=1)
    return {
        "target": target,
        "eagle3": write_eagle3_head(folder / "eagle3.gguf", target, seed=2),
        "dflash": write_dflash_head(folder / "dflash.gguf", target, seed=2),
    }


def _engine(files: dict[str, Path], drafter: str | None, parallel: int) -> Engine:
    target = LlamaCppModel(files["target"], n_ctx=CONTEXT, exact_kernels=True, parallel=parallel)
    engine = Engine(target)
    # As calibrated on a CPU where verify batches of up to 7 tokens round like
    # one-token decoding under exact kernels (backends/llamacpp/params.py): rounds of
    # two sequences gather into one decode.
    engine.costs = CostModel({1: 0.01, 8: 0.02}, 0.005, exact_batch_limit=7)
    if drafter is not None:
        attach, key = HEADS[drafter]
        getattr(engine, attach)(files[key])
    return engine


def _request(engine: Engine, text: str, drafter: str) -> GenerationRequest:
    return greedy_chat_request(engine, text, drafter, max_tokens=MAX_TOKENS, draft_tokens=2)


@pytest.fixture(scope="module")
def alone(files: dict[str, Path]) -> dict[str, list[int]]:
    """Each prompt's greedy reply, decoded plainly by a target of one sequence."""
    engine = _engine(files, None, 1)
    try:
        return {
            text: reply_tokens(list(engine.generate(_request(engine, text, "none"))))
            for text in PROMPTS
        }
    finally:
        engine.close()


@pytest.fixture
def exchange() -> Iterator[RuntimeExchange]:
    """A runtime thread serving the exchange, as the engine's server runs one."""
    with serving_exchange() as exchange:
        yield exchange


def _run_together(
    engine: Engine, slots: EngineSlots, drafter: str
) -> tuple[dict[str, list[int]], dict[str, list]]:
    """Every prompt on a slot of its own, generated at once: replies and events."""
    done = run_on_slots(slots, {text: _request(engine, text, drafter) for text in PROMPTS})
    events = {str(text): slot_events for text, (_, slot_events) in done.items()}
    return {text: reply_tokens(e) for text, e in events.items()}, events


@pytest.mark.parametrize("drafter", ["eagle3", "dflash"])
def test_each_sequence_drafts_with_its_head_and_writes_its_reply_alone(
    files: dict[str, Path], alone: dict[str, list[int]], exchange: RuntimeExchange, drafter: str
) -> None:
    """Three prompts at once, each drafting with the head under exact kernels: each
    reply is plain decoding's of that prompt alone, and every sequence's head drafted."""
    assert len({tuple(reply) for reply in alone.values()}) == len(PROMPTS)
    engine = _engine(files, drafter, len(PROMPTS))
    slots = EngineSlots(engine, exchange)
    shared = record_shared_decodes(slots)  # how many sequences each decode carried
    try:
        assert slots.count == len(PROMPTS)
        replies, events = _run_together(engine, slots, drafter)
        assert replies == alone
        for text in PROMPTS:
            head_rounds = [e for e in events[text] if e.drafter == drafter and e.draft_length]
            assert head_rounds, f"{text!r}: its sequence's {drafter} head never drafted"
        assert max(shared) > 1, "the sequences shared no decode"
    finally:
        slots.close()
        engine.close()


@pytest.mark.parametrize("drafter", ["eagle3", "dflash"])
def test_a_sequence_s_head_reads_its_own_sequence_only(
    files: dict[str, Path], exchange: RuntimeExchange, drafter: str
) -> None:
    """After replies written at once, each sequence's head drafts what a head of one
    sequence that read the same conversation drafts (an EAGLE-3 head's chain too, with
    another sequence's head drafting between its steps): no sequence's rows went to
    another's head, and every rollback cut the right one back."""
    engine = _engine(files, drafter, len(PROMPTS))
    slots = EngineSlots(engine, exchange)
    fresh = _engine(files, drafter, 1)
    try:
        replies, _ = _run_together(engine, slots, drafter)
        firsts = []
        for index, text in enumerate(PROMPTS):
            prompt = list(_request(engine, text, drafter).prompt_tokens)
            context = prompt + replies[text]
            slot = slots.take(context)
            other = slots.take(list(_request(engine, PROMPTS[index - 1], drafter).prompt_tokens))
            evaluated = len(slot.target.cached_tokens)
            assert list(slot.target.cached_tokens) == context[:evaluated]
            rows = head_rows(slot, drafter, context[: evaluated + 1], between=other)
            slots.give_back(other)
            slots.give_back(slot)
            fresh.target.rollback(0)
            fresh.target.prefill(context[:evaluated])
            alone = head_rows(fresh, drafter, context[: evaluated + 1])
            for row, row_alone in zip(rows, alone, strict=True):
                assert int(np.argmax(row)) == int(np.argmax(row_alone))
                # Rounding differs with how the rows were batched (3e-3 seen in logits
                # near 9).
                np.testing.assert_allclose(row, row_alone, atol=1e-2, rtol=0)
            firsts.append(rows[0])
        assert not np.allclose(firsts[0], firsts[1], atol=1e-2), "the rows tell sequences apart"
    finally:
        fresh.close()
        slots.close()
        engine.close()


@pytest.mark.parametrize("drafter", ["eagle3", "dflash"])
def test_a_sequence_s_head_drafts_as_its_q_and_verified_tokens_follow_p(
    files: dict[str, Path], exchange: RuntimeExchange, drafter: str
) -> None:
    """On a sequence other than the first, the head's drafts follow the q it reports
    and the loop's accept step emits tokens that follow the target's p (with the
    negative control): tests/support/draft_distribution.py."""
    engine = _engine(files, drafter, 2)
    slots = EngineSlots(engine, exchange)
    try:
        slots.take([])  # the first slot stays taken: the check runs on sequence 1
        slot = slots.take([])
        assert slot.target._seq == 1  # type: ignore[attr-defined]
        check_head_drafts_are_exact(
            slot,
            drafter,
            slot.chat_prompt([ChatMessage("user", PROMPTS[0])]),
            temperature=3.0,
            support=16,
            samples=2000,
        )
    finally:
        slots.close()
        engine.close()


class _StepByStep:
    """A sequence's head as the drafter saw it before ``within``: a trip to the runtime
    thread for each call that computes."""

    def __init__(self, head: object) -> None:
        self._head = head

    def start(self, evaluated: int, context: list[int]) -> object:
        return self._head.start(evaluated, context)  # type: ignore[attr-defined]

    def step(self, token: int) -> object:
        return self._head.step(token)  # type: ignore[attr-defined]

    def finish(self) -> None:
        self._head.finish()  # type: ignore[attr-defined]


def test_a_sequence_s_eagle3_chain_is_one_trip_to_the_runtime_and_drafts_the_same(
    files: dict[str, Path], exchange: RuntimeExchange
) -> None:
    """On a sequence of a parallel target, an EAGLE-3 round's chain (start, steps and
    the sampling between them) goes to the runtime thread in one trip, and drafts the
    tokens and q a trip per step drafts."""
    from backends.speculation.eagle3_drafter import Eagle3Drafter

    engine = _engine(files, "eagle3", 2)
    slots = EngineSlots(engine, exchange)
    trips: list[int] = []
    submit = exchange.submit

    def counting(work):  # type: ignore[no-untyped-def]
        trips.append(1)
        return submit(work)

    try:
        slots.take([])
        slot = slots.take([])
        prompt = slot.chat_prompt([ChatMessage("user", PROMPTS[1])])
        slot.target.prefill(prompt[:-1])
        drafter = slot.drafter_named("eagle3")
        assert isinstance(drafter, Eagle3Drafter)
        stepwise = Eagle3Drafter(slot.target, _StepByStep(drafter.head))  # type: ignore[arg-type]
        params = SamplingParams(temperature=0.7)
        proposals = []
        exchange.submit = counting  # type: ignore[method-assign]
        for each in (drafter, stepwise):
            trips.clear()
            proposal = each.propose(prompt, 5, params, np.random.default_rng(7))
            proposals.append((proposal, len(trips)))
        (whole, whole_trips), (steps, step_trips) = proposals
        assert len(whole.tokens) == 5
        assert whole_trips == 1
        assert step_trips == 5  # the start and four steps
        assert whole.tokens == steps.tokens
        assert whole.distributions is not None and steps.distributions is not None
        for ours, theirs in zip(whole.distributions, steps.distributions, strict=True):
            np.testing.assert_array_equal(ours.ids, theirs.ids)
            np.testing.assert_allclose(ours.probs, theirs.probs, rtol=1e-5)
    finally:
        exchange.submit = submit  # type: ignore[method-assign]
        slots.close()
        engine.close()
