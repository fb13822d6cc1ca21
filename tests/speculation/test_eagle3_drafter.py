"""``--drafter eagle3``: an EAGLE-3 head reads the target's layer inputs and drafts, exactly.

Tiny random-weight llama and qwen3 targets with EAGLE-3 heads written for them
(tests/support/tiny_eagle3.py), loaded by llama.cpp through llama-cpp-python. Random
weights make the head a poor guesser (most drafts are rejected), which exercises the
head's rollback every round; exactness does not depend on the weights. At temperature
> 0 the drafts are checked the way test_mtp_drafter.py checks the MTP head's, with the
real rows: drafts are distributed as the head's reported ``q``, and the loop's
accept/resample step then emits tokens distributed as the target's ``p`` (the negative
control, drafts emitted unverified, misses ``p`` by far more than the bound allows).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.errors import BackendError, ModelLoadError
from backends.generation_events import GenerationEvent
from backends.sampling.filters import SamplingParams
from tests.support.draft_distribution import check_head_drafts_are_exact
from tests.support.model_files import DRAFT_KEY, SMOLLM2_KEY, require_model
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target

pytestmark = pytest.mark.real_model

llamacpp = pytest.importorskip("backends.llamacpp.model")
LlamaCppModel = llamacpp.LlamaCppModel

CONTEXT = 1024
PROMPT = [ChatMessage("user", "Write a short poem about the sea, please.")]
SAMPLES = 2000
SUPPORT = 16
TEMPERATURE = 3.0  # flat enough that the head's q and the target's p overlap


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny targets and the heads written for them (and for other targets)."""
    tokenizer = require_model(SMOLLM2_KEY)
    folder = tmp_path_factory.mktemp("tiny-eagle3")
    llama = write_tiny_target(folder / "tiny-llama.gguf", tokenizer, seed=1)
    qwen3 = write_tiny_target(folder / "tiny-qwen3.gguf", tokenizer, seed=3, arch="qwen3")
    narrow = write_tiny_target(folder / "tiny-narrow.gguf", tokenizer, seed=5, n_embd=32)
    return {
        "llama": llama,
        "llama-head": write_eagle3_head(folder / "llama-eagle3.gguf", llama, seed=2),
        "llama-own-head": write_eagle3_head(
            folder / "llama-eagle3-own.gguf", llama, seed=2, own_vocabulary=True
        ),
        "qwen3": qwen3,
        "qwen3-head": write_eagle3_head(folder / "qwen3-eagle3.gguf", qwen3, seed=4),
        "narrow-head": write_eagle3_head(folder / "narrow-eagle3.gguf", narrow, seed=6),
    }


def engine_with_head(target: Path, head: Path | None, **load: object) -> Engine:
    engine = Engine(LlamaCppModel(target, n_ctx=CONTEXT, **load))  # type: ignore[arg-type]
    if head is not None:
        engine.attach_eagle3_head(head)
    return engine


@pytest.fixture
def engine(files) -> Iterator[Engine]:
    engine = engine_with_head(files["llama"], files["llama-head"])
    yield engine
    engine.close()


def generate(
    engine: Engine,
    prompt: list[int],
    drafter: str,
    *,
    params: SamplingParams | None = None,
    exact: bool = False,
) -> tuple[list[int], list[GenerationEvent]]:
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        max_tokens=50,
        drafter=drafter,
        draft_tokens=4,
        params=params or SamplingParams(),
        exact=exact,
    )
    events = list(engine.generate(request))
    return [token for event in events for token in event.tokens], events


@pytest.mark.parametrize(
    ("target", "head"),
    [("llama", "llama-head"), ("llama", "llama-own-head"), ("qwen3", "qwen3-head")],
)
def test_greedy_eagle3_speculation_under_exact_writes_what_plain_decoding_writes(
    files, target, head
):
    """Plain decoding on a target that never fed a head, against the same file drafting
    with its head under exact kernels: token for token (the head's layer-input
    extraction leaves the target's own computation alone)."""
    plain_engine = engine_with_head(files[target], None, exact_kernels=True)
    try:
        prompt = plain_engine.chat_prompt(PROMPT)
        plain, _ = generate(plain_engine, prompt, "none", exact=True)
    finally:
        plain_engine.close()
    engine = engine_with_head(files[target], files[head], exact_kernels=True)
    try:
        speculative, events = generate(engine, prompt, "eagle3", exact=True)
        again, _ = generate(engine, prompt, "none", exact=True)
    finally:
        engine.close()
    assert speculative == plain
    assert again == plain
    head_rounds = [event for event in events if event.drafter == "eagle3"]
    assert head_rounds, "the EAGLE-3 head never drafted"
    # Its random guesses are mostly rejected: the head is rolled back deeper than one.
    assert max(event.draft_length - sum(event.from_draft) for event in head_rounds) >= 2


def test_sampled_eagle3_speculation_runs_through_the_loop(engine: Engine):
    prompt = engine.chat_prompt(PROMPT)
    params = SamplingParams(temperature=0.8, top_k=20, seed=5)
    tokens, events = generate(engine, prompt, "eagle3", params=params)
    assert len(tokens) == 50
    assert events[-1].stats.drafted > 0
    assert {event.drafter for event in events} >= {"eagle3"}


def test_eagle3_drafts_are_distributed_as_its_q_and_verified_tokens_as_p(engine: Engine):
    """The head's reported q is what its drafts are drawn from, so the loop's accept
    step emits tokens distributed as the target's p (tests/support/draft_distribution.py;
    with its negative control)."""
    check_head_drafts_are_exact(
        engine,
        "eagle3",
        engine.chat_prompt(PROMPT),
        temperature=TEMPERATURE,
        support=SUPPORT,
        samples=SAMPLES,
    )


def test_a_head_for_a_target_of_another_hidden_size_is_refused(files):
    engine = engine_with_head(files["llama"], None)
    try:
        with pytest.raises(ModelLoadError, match="hidden size of 32, the target's is 64"):
            engine.attach_eagle3_head(files["narrow-head"])
        with pytest.raises(BackendError, match="has no EAGLE-3 head loaded"):
            engine.drafter_named("eagle3")
    finally:
        engine.close()


def test_a_head_for_another_vocabulary_is_refused(files, tmp_path: Path):
    """A head converted with another model's tokenizer (Qwen2.5's 151,936 tokens)."""
    other = write_eagle3_head(
        tmp_path / "qwen-vocab-eagle3.gguf",
        files["llama"],
        tokenizer_source=require_model(DRAFT_KEY),
    )
    engine = engine_with_head(files["llama"], None)
    try:
        with pytest.raises(
            ModelLoadError, match="vocabulary has 151936 tokens, the target's 49152"
        ):
            engine.attach_eagle3_head(other)
    finally:
        engine.close()


def test_a_file_that_is_no_eagle3_head_is_refused(files):
    engine = engine_with_head(files["llama"], None)
    try:
        with pytest.raises(ModelLoadError, match="architecture is not eagle3"):
            engine.attach_eagle3_head(files["qwen3"])
    finally:
        engine.close()
