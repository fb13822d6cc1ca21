"""``--drafter dflash|dspark``: a DFlash or DSpark head reads the target's layer inputs and
drafts a whole block in one forward, exactly.

Tiny random-weight llama and qwen3 targets (tests/support/tiny_eagle3.py) with DFlash and
DSpark heads written for them (tests/support/tiny_dflash.py), loaded by llama.cpp through
llama-cpp-python. Random weights make the head a poor guesser (most drafts are rejected),
which exercises the head's rollback every round; exactness does not depend on the
weights. At temperature > 0 the drafts are checked as test_eagle3_drafter.py checks the
EAGLE-3 head's, with the real rows: drafts are distributed as the head's reported ``q``,
and the loop's accept/resample step then emits tokens distributed as the target's ``p``
(the negative control, drafts emitted unverified, misses ``p`` by far more than the bound
allows).
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
from tests.support.tiny_dflash import BLOCK_SIZE, write_dflash_head
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target
from tests.support.tiny_hybrid import write_tiny_qwen35

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
    folder = tmp_path_factory.mktemp("tiny-dflash")
    llama = write_tiny_target(folder / "tiny-llama.gguf", tokenizer, seed=1)
    qwen3 = write_tiny_target(folder / "tiny-qwen3.gguf", tokenizer, seed=3, arch="qwen3")
    narrow = write_tiny_target(folder / "tiny-narrow.gguf", tokenizer, seed=5, n_embd=32)
    return {
        "llama": llama,
        "llama-dflash": write_dflash_head(folder / "llama-dflash.gguf", llama, seed=2),
        "llama-dspark": write_dflash_head(folder / "llama-dspark.gguf", llama, seed=2, dspark=True),
        "qwen3": qwen3,
        "qwen3-dflash": write_dflash_head(folder / "qwen3-dflash.gguf", qwen3, seed=4),
        "narrow-dflash": write_dflash_head(folder / "narrow-dflash.gguf", narrow, seed=6),
        "llama-eagle3": write_eagle3_head(folder / "llama-eagle3.gguf", llama, seed=2),
    }


def engine_with_head(target: Path, head: Path | None, **load: object) -> Engine:
    engine = Engine(LlamaCppModel(target, n_ctx=CONTEXT, **load))  # type: ignore[arg-type]
    if head is not None:
        engine.attach_dflash_head(head)
    return engine


@pytest.fixture(params=["llama-dflash", "llama-dspark"])
def engine(files, request) -> Iterator[Engine]:
    engine = engine_with_head(files["llama"], files[request.param])
    yield engine
    engine.close()


def generate(
    engine: Engine,
    prompt: list[int],
    drafter: str,
    *,
    params: SamplingParams | None = None,
    exact: bool = False,
    draft_tokens: int = 4,
) -> tuple[list[int], list[GenerationEvent]]:
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        max_tokens=50,
        drafter=drafter,
        draft_tokens=draft_tokens,
        params=params or SamplingParams(),
        exact=exact,
    )
    events = list(engine.generate(request))
    return [token for event in events for token in event.tokens], events


@pytest.mark.parametrize(
    ("target", "head", "drafter"),
    [
        ("llama", "llama-dflash", "dflash"),
        ("llama", "llama-dspark", "dspark"),
        ("qwen3", "qwen3-dflash", "dflash"),
    ],
)
def test_greedy_block_speculation_under_exact_writes_what_plain_decoding_writes(
    files, target, head, drafter
):
    """Plain decoding on a target that never fed a head, against the same file drafting
    blocks with its head under exact kernels: token for token. The round's draft length
    (16) is cut to what one block drafts."""
    plain_engine = engine_with_head(files[target], None, exact_kernels=True)
    try:
        prompt = plain_engine.chat_prompt(PROMPT)
        plain, _ = generate(plain_engine, prompt, "none", exact=True)
    finally:
        plain_engine.close()
    engine = engine_with_head(files[target], files[head], exact_kernels=True)
    try:
        speculative, events = generate(engine, prompt, drafter, exact=True, draft_tokens=16)
        again, _ = generate(engine, prompt, "none", exact=True)
    finally:
        engine.close()
    assert speculative == plain
    assert again == plain
    head_rounds = [event for event in events if event.drafter == drafter]
    assert head_rounds, f"the {drafter} head never drafted"
    block = BLOCK_SIZE if drafter == "dspark" else BLOCK_SIZE - 1
    assert max(event.draft_length for event in head_rounds) == block
    # Its random guesses are mostly rejected: the head is rolled back deeper than one.
    assert max(event.draft_length - sum(event.from_draft) for event in head_rounds) >= 2


def test_sampled_block_speculation_runs_through_the_loop(engine: Engine):
    prompt = engine.chat_prompt(PROMPT)
    params = SamplingParams(temperature=0.8, top_k=20, seed=5)
    drafter = engine.drafter_named("dflash" if _is_dflash(engine) else "dspark").name
    tokens, events = generate(engine, prompt, drafter, params=params)
    assert len(tokens) == 50
    assert events[-1].stats.drafted > 0
    assert {event.drafter for event in events} >= {drafter}


def _is_dflash(engine: Engine) -> bool:
    try:
        engine.drafter_named("dflash")
    except BackendError:
        return False
    return True


@pytest.mark.parametrize("slot", [0, 2])
def test_block_drafts_are_distributed_as_its_q_and_verified_tokens_as_p(engine: Engine, slot: int):
    """The head's reported q for a block's slot is what its drafts there are drawn from,
    so the loop's accept step emits tokens distributed as the target's p: slot 0 against
    the target's p after the prompt, a later slot's q as the distribution its drafts
    follow (tests/support/draft_distribution.py; with its negative control)."""
    check_head_drafts_are_exact(
        engine,
        "dflash" if _is_dflash(engine) else "dspark",
        engine.chat_prompt(PROMPT),
        slot=slot,
        temperature=TEMPERATURE,
        support=SUPPORT,
        samples=SAMPLES,
    )


def test_a_head_for_a_target_of_another_hidden_size_is_refused(files):
    engine = engine_with_head(files["llama"], None)
    try:
        with pytest.raises(ModelLoadError, match="hidden size of 32, the target's is 64"):
            engine.attach_dflash_head(files["narrow-dflash"])
        with pytest.raises(BackendError, match="has no DFlash or DSpark head loaded"):
            engine.drafter_named("dflash")
    finally:
        engine.close()


def test_a_head_for_another_vocabulary_is_refused(files, tmp_path: Path):
    """A head converted with another model's tokenizer (Qwen2.5's 151,936 tokens)."""
    other = write_dflash_head(
        tmp_path / "qwen-vocab-dflash.gguf",
        files["llama"],
        tokenizer_source=require_model(DRAFT_KEY),
    )
    engine = engine_with_head(files["llama"], None)
    try:
        with pytest.raises(
            ModelLoadError, match="vocabulary has 151936 tokens, the target's 49152"
        ):
            engine.attach_dflash_head(other)
    finally:
        engine.close()


def test_a_file_that_is_no_dflash_head_is_refused(files):
    engine = engine_with_head(files["llama"], None)
    try:
        with pytest.raises(ModelLoadError, match="architecture is eagle3, not dflash"):
            engine.attach_dflash_head(files["llama-eagle3"])
        with pytest.raises(ModelLoadError, match="architecture is qwen3, not dflash"):
            engine.attach_dflash_head(files["qwen3"])
    finally:
        engine.close()


def test_a_dspark_head_is_not_drafted_with_under_dflash_s_name(files):
    engine = engine_with_head(files["llama"], files["llama-dspark"])
    try:
        assert engine.drafter_named("dspark").name == "dspark"
        with pytest.raises(
            BackendError, match="is a DSpark head, not a DFlash head: use --drafter dspark"
        ):
            engine.drafter_named("dflash")
    finally:
        engine.close()


def test_a_head_is_refused_for_a_hybrid_target(files, tmp_path: Path):
    """A hybrid target's recurrent state is not followed by a block head's cache."""
    hybrid = write_tiny_qwen35(tmp_path / "tiny-qwen35.gguf", require_model(SMOLLM2_KEY))
    engine = engine_with_head(hybrid, None)
    try:
        with pytest.raises(BackendError, match="keeps a recurrent state; a DFlash or DSpark"):
            engine.attach_dflash_head(files["llama-dflash"])
    finally:
        engine.close()
