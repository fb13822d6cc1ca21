"""MTP heads on attention targets: Gemma 4's assistant (a separate head that reads the
target's own cache) and a GLM-4.5-style target's own nextn block, alone and with
``--parallel``, where each sequence drafts with a head state of its own.

The tiny random-weight files the tests write (tests/support/tiny_gemma4.py,
tiny_glm4moe.py), loaded by llama.cpp through llama-cpp-python; the real views, decode
batcher, runtime exchange and slots, with their threads. Random weights reject most
drafts, so every round rolls the target back, and each sequence's head with it.

Greedy output equal to plain decoding is asserted on both targets under exact kernels,
alone and three sequences at once. The tiny Gemma 4 is quantized to Q8_0 for it: with
float weights its batched rows rounded up to 0.02 away from one-token decoding in a
logit, enough to flip a near-tie; quantized they round bit for bit
(tests/support/tiny_gemma4.py).
What proves besides that the assistant changes nothing is that drafting leaves the
target's cache, and the row it computes next, bit for bit as they were: the head reads
the target's keys and values and writes none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.engine_slots import EngineSlots
from backends.errors import ModelLoadError
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
from tests.support.tiny_gemma4 import write_tiny_gemma4, write_tiny_gemma4_assistant
from tests.support.tiny_glm4moe import write_tiny_glm4moe

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
TARGETS = ("gemma4", "glm4moe")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tokenizer = require_model(SMOLLM2_KEY)
    folder = tmp_path_factory.mktemp("mtp-heads")
    return {
        "gemma4": write_tiny_gemma4(folder / "tiny-gemma4.gguf", tokenizer, seed=1),
        "assistant": write_tiny_gemma4_assistant(
            folder / "tiny-gemma4-assistant.gguf", tokenizer, seed=2
        ),
        "glm4moe": write_tiny_glm4moe(folder / "tiny-glm4moe.gguf", tokenizer, seed=1),
    }


def _engine(files: dict[str, Path], target: str, parallel: int, *, head: bool = True) -> Engine:
    model = LlamaCppModel(files[target], n_ctx=CONTEXT, exact_kernels=True, parallel=parallel)
    engine = Engine(model)
    # As calibrated on a CPU where verify batches of up to 7 tokens round like
    # one-token decoding under exact kernels: rounds of several sequences gather.
    engine.costs = CostModel({1: 0.01, 8: 0.02}, 0.005, exact_batch_limit=7)
    if head and target == "gemma4":
        engine.attach_mtp_head(files["assistant"])
    return engine


def _request(engine: Engine, text: str, drafter: str) -> GenerationRequest:
    return greedy_chat_request(engine, text, drafter, max_tokens=MAX_TOKENS, draft_tokens=3)


@pytest.fixture(scope="module")
def alone(files: dict[str, Path]) -> dict[str, dict[str, list[int]]]:
    """Each target's greedy reply to each prompt, decoded plainly with one sequence."""
    replies: dict[str, dict[str, list[int]]] = {}
    for target in TARGETS:
        engine = _engine(files, target, 1, head=False)
        try:
            replies[target] = {
                text: reply_tokens(list(engine.generate(_request(engine, text, "none"))))
                for text in PROMPTS
            }
        finally:
            engine.close()
    return replies


@pytest.fixture
def exchange() -> Iterator[RuntimeExchange]:
    with serving_exchange() as exchange:
        yield exchange


@pytest.mark.parametrize("target", TARGETS)
def test_the_mtp_head_drafts_and_greedy_output_is_plain_decodings(
    files: dict[str, Path], alone: dict[str, dict[str, list[int]]], target: str
) -> None:
    """One sequence: every prompt's reply under ``--drafter mtp --exact`` is plain
    decoding's, the head drafted in it, and rejected drafts rolled back deeper than
    one token (one conversation after another on the same engine)."""
    assert len({tuple(reply) for reply in alone[target].values()}) == len(PROMPTS)
    engine = _engine(files, target, 1)
    try:
        assert engine.head_names() == ["mtp"]
        for text in PROMPTS:
            events = list(engine.generate(_request(engine, text, "mtp")))
            assert reply_tokens(events) == alone[target][text]
            rounds = [event for event in events if event.drafter == "mtp"]
            assert rounds, f"{target}: the MTP head never drafted for {text!r}"
            assert max(e.draft_length - sum(e.from_draft) for e in rounds) >= 2
    finally:
        engine.close()


@pytest.mark.parametrize("target", TARGETS)
def test_the_mtp_head_s_drafts_follow_q_and_verified_tokens_follow_p(
    files: dict[str, Path], target: str
) -> None:
    """The head's drafts (the assistant's reading the target's cache) follow the q it
    reports, and the accept step emits the target's p, with the negative control
    (tests/support/draft_distribution.py)."""
    engine = _engine(files, target, 1)
    try:
        prompt = engine.chat_prompt([ChatMessage("user", PROMPTS[0])])
        check_head_drafts_are_exact(
            engine, "mtp", prompt, temperature=3.0, support=16, samples=2000
        )
    finally:
        engine.close()


@pytest.mark.parametrize("target", TARGETS)
def test_each_sequence_drafts_with_its_mtp_head_and_writes_its_reply_alone(
    files: dict[str, Path],
    alone: dict[str, dict[str, list[int]]],
    exchange: RuntimeExchange,
    target: str,
) -> None:
    """``--parallel 3``: the target is not refused several sequences for its MTP head;
    three prompts at once each write plain decoding's reply alone, every sequence
    drafts with the head, and rounds share decodes."""
    engine = _engine(files, target, len(PROMPTS))
    assert engine.target.parallel == len(PROMPTS)
    slots = EngineSlots(engine, exchange)
    shared = record_shared_decodes(slots)  # how many sequences each decode carried
    try:
        requests = {text: _request(engine, text, "mtp") for text in PROMPTS}
        done = run_on_slots(slots, requests)
        for text in PROMPTS:
            events = done[text][1]
            assert reply_tokens(events) == alone[target][text]
            rounds = [e for e in events if e.drafter == "mtp" and e.draft_length]
            assert rounds, f"{text!r}: its sequence's MTP head never drafted"
        assert max(shared) > 1, "the sequences shared no decode"
    finally:
        slots.close()
        engine.close()


@pytest.mark.parametrize("target", TARGETS)
def test_a_sequence_s_mtp_head_drafts_as_its_q_and_verified_tokens_follow_p(
    files: dict[str, Path], exchange: RuntimeExchange, target: str
) -> None:
    """On the second sequence of a parallel target, the head's drafts follow its q and
    accepted tokens the target's p (its rows are that sequence's own)."""
    engine = _engine(files, target, 2)
    slots = EngineSlots(engine, exchange)
    try:
        slots.take([])
        slot = slots.take([])
        assert slot.target._seq == 1  # type: ignore[attr-defined]
        check_head_drafts_are_exact(
            slot,
            "mtp",
            slot.chat_prompt([ChatMessage("user", PROMPTS[1])]),
            temperature=3.0,
            support=16,
            samples=2000,
        )
    finally:
        slots.close()
        engine.close()


def _state_and_next_row(model, token: int) -> tuple[bytes, np.ndarray]:  # type: ignore[no-untyped-def]
    """The target sequence's cache, bit for bit, and the row it computes for ``token``
    next (then forgotten again)."""
    state = bytes(model.save_state().payload)
    kept = len(model.cached_tokens)
    row = np.array(model.forward([token])[0], dtype=np.float32)
    model.rollback(kept)
    return state, row


def _draft_chains(engine: Engine, prompt: list[int], rounds: int) -> int:
    """Draft ``rounds`` chains of 4 after ``prompt`` (its last token pending); how many
    tokens were drafted."""
    drafter = engine.drafter_named("mtp")
    params = SamplingParams(temperature=1.0)
    rng = np.random.default_rng(3)
    return sum(len(drafter.propose(prompt, 4, params, rng).tokens) for _ in range(rounds))


@pytest.mark.parametrize("parallel", [1, 2])
def test_the_gemma4_assistant_reads_the_target_s_cache_and_writes_nothing(
    files: dict[str, Path], exchange: RuntimeExchange, parallel: int
) -> None:
    """Chains drafted by the assistant (on the second sequence of a parallel target,
    beside a first that holds another conversation) leave every sequence's cache and
    the row each computes next bit for bit as they were."""
    engine = _engine(files, "gemma4", parallel)
    slots = EngineSlots(engine, exchange) if parallel > 1 else None
    try:
        engines = [slots.take([]), slots.take([])] if slots is not None else [engine]
        prompts = [
            engines[0].chat_prompt([ChatMessage("user", text)]) for text in PROMPTS[: len(engines)]
        ]
        for each, prompt in zip(engines, prompts, strict=True):
            each.target.prefill(prompt[:-1])
        before = [
            _state_and_next_row(each.target, prompt[-1])
            for each, prompt in zip(engines, prompts, strict=True)
        ]
        assert _draft_chains(engines[-1], prompts[-1], rounds=5) == 20
        after = [
            _state_and_next_row(each.target, prompt[-1])
            for each, prompt in zip(engines, prompts, strict=True)
        ]
        for (state, row), (state_after, row_after) in zip(before, after, strict=True):
            assert state_after == state
            np.testing.assert_array_equal(row_after, row)
    finally:
        if slots is not None:
            slots.close()
        engine.close()


def test_an_assistant_for_another_target_is_refused_with_the_reason(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """A Gemma 4 assistant trained for a target of another width: refused, saying so."""
    other = write_tiny_gemma4_assistant(
        tmp_path / "assistant-96.gguf", require_model(SMOLLM2_KEY), seed=2, backbone=96
    )
    engine = _engine(files, "gemma4", 1, head=False)
    try:
        with pytest.raises(ModelLoadError, match=r"hidden size 96, not tiny-gemma4 \(128\)"):
            engine.attach_mtp_head(other)
        with pytest.raises(ModelLoadError, match="no MTP head"):
            engine.attach_mtp_head(files["gemma4"])  # a model with no nextn layers
    finally:
        engine.close()


@pytest.mark.parametrize("target", TARGETS)
def test_a_sequence_s_mtp_head_reads_its_own_sequence_only(
    files: dict[str, Path], exchange: RuntimeExchange, target: str
) -> None:
    """After replies written at once, each sequence's head drafts what the head of a
    one-sequence target that read the same conversation drafts (its first row and its
    chain's next): no sequence's hidden states went to another's head, and every
    rollback cut the right one back."""
    engine = _engine(files, target, len(PROMPTS))
    slots = EngineSlots(engine, exchange)
    fresh = _engine(files, target, 1)
    try:
        done = run_on_slots(slots, {text: _request(engine, text, "mtp") for text in PROMPTS})
        firsts = []
        for text in PROMPTS:
            context = list(_request(engine, text, "mtp").prompt_tokens)
            context += reply_tokens(done[text][1])
            slot = slots.take(context)
            evaluated = len(slot.target.cached_tokens)
            assert list(slot.target.cached_tokens) == context[:evaluated]
            rows = head_rows(slot, "mtp", context[: evaluated + 1])
            slots.give_back(slot)
            fresh.target.rollback(0)
            fresh.target.prefill(context[:evaluated])
            alone = head_rows(fresh, "mtp", context[: evaluated + 1])
            for row, row_alone in zip(rows, alone, strict=True):
                assert int(np.argmax(row)) == int(np.argmax(row_alone))
                # Rounding differs with how the rows were batched.
                np.testing.assert_allclose(row, row_alone, atol=1e-2, rtol=0)
            firsts.append(rows[0])
        assert not np.allclose(firsts[0], firsts[1], atol=1e-2), "the rows tell sequences apart"
    finally:
        fresh.close()
        slots.close()
        engine.close()
