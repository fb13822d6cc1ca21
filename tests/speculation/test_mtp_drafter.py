"""``--drafter mtp``: the target's own multi-token-prediction head drafts, exactly.

A tiny random-weight ``qwen35`` target with one nextn block (tests/support/tiny_hybrid.py),
and the same head alone in a separate MTP file beside a target without one. Random
weights make the head a poor guesser (most drafts are rejected), which exercises
rollback every round; exactness does not depend on the weights. At temperature > 0
the drafts are checked the way tests/speculation/test_sampling_lossless.py checks the accept
step, with the real rows: drafts are distributed as the head's reported ``q``, and
the loop's accept/resample step then emits tokens distributed as the target's ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.errors import BackendError
from backends.generation_events import GenerationEvent
from backends.sampling.filters import SamplingParams
from backends.speculation.cost_model import CostModel
from backends.speculation.mtp_drafter import MtpDrafter
from tests.support.draft_distribution import FAILURE_PROBABILITY, check_head_drafts_are_exact
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tiny_hybrid import mtp_only, tiny_qwen35_tensors, write_tiny_qwen35

pytestmark = pytest.mark.real_model

llamacpp = pytest.importorskip("backends.llamacpp.model")
LlamaCppModel = llamacpp.LlamaCppModel

CONTEXT = 1024
PROMPT = [ChatMessage("user", "Write a short poem about the sea, please.")]
GPU_LIKE_COSTS = {1: 0.010, 2: 0.0102, 3: 0.0104, 4: 0.0106, 5: 0.0108, 8: 0.011, 16: 0.012}
# The distribution checks (see tests/speculation/test_sampling_lossless.py for the bound).
SAMPLES = 2000
SUPPORT = 16
TEMPERATURE = 3.0  # flat enough that the head's q and the target's p overlap


@pytest.fixture(scope="module")
def mtp_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A target with its MTP head inside; a target without one; that head alone."""
    tokenizer = require_model(SMOLLM2_KEY)
    import gguf

    n_vocab = len(gguf.GGUFReader(tokenizer).fields["tokenizer.ggml.tokens"].contents())
    folder = tmp_path_factory.mktemp("tiny-mtp")
    # One seed: the trunk comes out the same with or without the head after it.
    weights = tiny_qwen35_tensors(n_vocab, seed=1, nextn_layers=1)
    with_head = write_tiny_qwen35(
        folder / "tiny-qwen35-mtp.gguf", tokenizer, nextn_layers=1, tensors=weights
    )
    trunk = {name: values for name, values in weights.items() if not name.startswith("blk.2.")}
    without = write_tiny_qwen35(folder / "tiny-qwen35.gguf", tokenizer, tensors=trunk)
    head = write_tiny_qwen35(
        folder / "tiny-qwen35-mtp-head.gguf", tokenizer, nextn_layers=1, tensors=mtp_only(weights)
    )
    return with_head, without, head


@pytest.fixture
def engine(mtp_files) -> Iterator[Engine]:
    engine = Engine(
        LlamaCppModel(mtp_files[0], n_ctx=CONTEXT),
        costs=CostModel(dict(GPU_LIKE_COSTS), None),
    )
    yield engine
    engine.close()


def generate(
    engine: Engine, prompt: list[int], drafter: str, *, params: SamplingParams | None = None
) -> tuple[list[int], list[GenerationEvent]]:
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        max_tokens=50,
        drafter=drafter,
        draft_tokens=4,
        params=params or SamplingParams(),
    )
    events = list(engine.generate(request))
    return [token for event in events for token in event.tokens], events


def test_the_target_offers_its_mtp_head(engine: Engine):
    assert engine.target.mtp_layers == 1
    assert engine.drafter_named("mtp").name == "mtp"


@pytest.mark.parametrize("drafter", ["mtp", "auto"])
def test_greedy_mtp_speculation_writes_what_plain_decoding_writes(engine: Engine, drafter):
    prompt = engine.chat_prompt(PROMPT)
    plain, _ = generate(engine, prompt, "none")
    speculative, events = generate(engine, prompt, drafter)
    assert speculative == plain
    if drafter == "auto":
        # auto's K and drafter follow the costs it measured on this (shared, noisy)
        # machine, so only its output is asserted here; its choice of the head is
        # tested on fakes (test_mtp_controller.py).
        return
    mtp_rounds = [event for event in events if event.drafter == "mtp"]
    assert mtp_rounds, "the MTP head never drafted"
    # Its random guesses are mostly rejected: rollbacks deeper than one token.
    assert max(event.draft_length - sum(event.from_draft) for event in mtp_rounds) >= 2


def test_sampled_mtp_speculation_runs_through_the_loop(engine: Engine):
    prompt = engine.chat_prompt(PROMPT)
    params = SamplingParams(temperature=0.8, top_k=20, seed=5)
    tokens, events = generate(engine, prompt, "mtp", params=params)
    assert len(tokens) == 50
    assert events[-1].stats.drafted > 0
    assert {event.drafter for event in events} >= {"mtp"}


def test_mtp_drafts_are_distributed_as_its_q_and_verified_tokens_as_p(engine: Engine):
    """The head's reported q is what its drafts are drawn from, so the loop's accept
    step (min(1, p/q), else the residual) emits tokens distributed as the target's p,
    and accepts drafts as often as exact rejection sampling does: sum(min(p, q)), more
    than llama.cpp's sample-and-match (a target sample that equals the draft), sum(p*q).

    The negative control trusts the drafts (emits them unverified): it misses p by far
    more than the bound allows.
    """
    engine.target.rollback(0)
    accepted, match = check_head_drafts_are_exact(
        engine,
        "mtp",
        engine.chat_prompt(PROMPT),
        temperature=TEMPERATURE,
        support=SUPPORT,
        samples=SAMPLES,
    )
    hoeffding = math.sqrt(math.log(2 / FAILURE_PROBABILITY) / (2 * SAMPLES))
    assert accepted > match + hoeffding  # more than llama.cpp's sample-and-match


def test_an_mtp_head_from_a_separate_file_drafts_like_the_embedded_one(engine, mtp_files):
    prompt = engine.chat_prompt(PROMPT)
    embedded, embedded_events = generate(engine, prompt, "mtp")
    separate = Engine(LlamaCppModel(mtp_files[1], n_ctx=CONTEXT))
    try:
        assert separate.target.mtp_layers == 0
        with pytest.raises(BackendError, match="no MTP head"):
            separate.drafter_named("mtp")
        separate.attach_mtp_head(mtp_files[2])
        tokens, events = generate(separate, prompt, "mtp")
    finally:
        separate.close()
    assert tokens == embedded
    drafted = [event.tokens for event in events]
    assert drafted == [event.tokens for event in embedded_events]
    assert events[-1].stats.drafted == embedded_events[-1].stats.drafted


def test_the_mtp_drafter_follows_the_target_after_a_rollback(engine: Engine):
    """A rollback of the target drops the head's entries past the cut: a proposal after
    it reads the same rows as a fresh head would."""
    target = engine.target
    drafter: MtpDrafter = engine.drafter_named("mtp")
    params = SamplingParams()
    prompt = engine.chat_prompt(PROMPT)
    target.prefill(prompt[:-1])
    first = drafter.propose(prompt, 3, params, np.random.default_rng(0)).tokens
    target.forward([prompt[-1], 11, 12, 13])  # a verify whose drafts are all rejected
    target.rollback(len(prompt) - 1)
    assert drafter.propose(prompt, 3, params, np.random.default_rng(0)).tokens == first
