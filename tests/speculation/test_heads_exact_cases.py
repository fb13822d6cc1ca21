"""Draft heads (EAGLE-3, DFlash) exact wherever the loop is exact (issue 54 part 3):
under a grammar and the reply's penalties, chosen by ``auto`` and chained behind the
n-gram's match, and after a prompt prefix loaded from disk.

Tiny random-weight llama targets with heads written for them, on both runtimes: GGUFs
loaded by llama.cpp under exact kernels (tests/support/tiny_eagle3.py, tiny_dflash.py),
and MLX directories whose heads mlx-vlm reads (tests/support/tiny_mlx_heads.py). Each case
decodes greedily once without drafting and once drafting with the head, and the two
replies must be the same tokens. Random weights make the heads poor guessers, so most
drafts are rejected: every round exercises the head's rollback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.base import ChatMessage
from backends.caches.disk_prefixes import DiskPrefixes
from backends.caches.prefix_keys import BLOCK_TOKENS
from backends.caches.prefix_store import PrefixStore
from backends.engine import Engine, GenerationRequest
from backends.output.output_constraints import ConstraintSpec, JsonOutput
from backends.sampling.filters import SamplingParams
from backends.speculation.cost_model import CostModel
from tests.support import tiny_mlx_heads
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tiny_dflash import write_dflash_head
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target

pytestmark = pytest.mark.real_model

llamacpp = pytest.importorskip("backends.llamacpp.model")
LlamaCppModel = llamacpp.LlamaCppModel

CONTEXT = 2048
PROMPT = [ChatMessage("user", "Describe the requests library as JSON, please.")]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "language": {"enum": ["python", "rust", "go"]},
        "stars": {"type": "integer", "minimum": 0, "maximum": 99999},
    },
    "required": ["name", "language", "stars"],
    "additionalProperties": False,
}
# Costs of a machine where a verify batch costs about a step (a GPU's), so that `auto`
# drafts from its priors in these short replies; the loop corrects them as it measures.
GPU_LIKE = {1: 0.010, 2: 0.0102, 4: 0.0106, 8: 0.011, 16: 0.012}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tokenizer = require_model(SMOLLM2_KEY)
    folder = tmp_path_factory.mktemp("tiny-heads")
    llama = write_tiny_target(folder / "tiny-llama.gguf", tokenizer, seed=1)
    files = {
        "llamacpp": llama,
        "llamacpp-eagle3": write_eagle3_head(folder / "llama-eagle3.gguf", llama, seed=2),
        "llamacpp-dflash": write_dflash_head(folder / "llama-dflash.gguf", llama, seed=2),
    }
    if importlib.util.find_spec("mlx_vlm") is not None:
        files["mlx"] = tiny_mlx_heads.write_mlx_target(folder / "mlx-llama", seed=1)
        files["mlx-eagle3"] = tiny_mlx_heads.write_eagle3_head(folder / "mlx-eagle3", seed=2)
        files["mlx-dflash"] = tiny_mlx_heads.write_dflash_head(folder / "mlx-dflash", seed=2)
    return files


def engine_for(files: dict[str, Path], runtime: str, head: str | None, **options: object) -> Engine:
    if runtime not in files:
        pytest.skip("mlx-vlm is not installed: MLX runs no heads here")
    if runtime == "mlx":
        from backends.mlx.model import MlxModel

        target = MlxModel(files["mlx"], n_ctx=CONTEXT)
    else:
        target = LlamaCppModel(files["llamacpp"], n_ctx=CONTEXT, exact_kernels=True)
    engine = Engine(target, **options)  # type: ignore[arg-type]
    if head == "eagle3":
        engine.attach_eagle3_head(files[f"{runtime}-eagle3"])
    elif head == "dflash":
        engine.attach_dflash_head(files[f"{runtime}-dflash"])
    return engine


def reply(engine: Engine, prompt: list[int], drafter: str, **request: object) -> list:
    """The greedy reply's events under exact output."""
    generation = GenerationRequest(
        prompt_tokens=tuple(prompt),
        max_tokens=48,
        drafter=drafter,
        draft_tokens=4,
        exact=True,
        **request,  # type: ignore[arg-type]
    )
    return list(engine.generate(generation))


def tokens(events: list) -> list[int]:
    return [token for event in events for token in event.tokens]


def plain_and_headed(
    files: dict[str, Path], runtime: str, head: str, drafter: str, **request: object
) -> tuple[list, list]:
    """The same request decoded plainly, then drafted by ``drafter`` with ``head`` attached."""
    plain_engine = engine_for(files, runtime, None)
    try:
        prompt = plain_engine.chat_prompt(PROMPT)
        plain = reply(plain_engine, prompt, "none", **request)
    finally:
        plain_engine.close()
    engine = engine_for(files, runtime, head, costs=CostModel(dict(GPU_LIKE)))
    try:
        drafted = reply(engine, prompt, drafter, **request)
    finally:
        engine.close()
    return plain, drafted


HEADS = [
    ("llamacpp", "eagle3"),
    ("llamacpp", "dflash"),
    ("mlx", "eagle3"),
    ("mlx", "dflash"),
]


@pytest.mark.parametrize(("runtime", "head"), HEADS)
def test_under_a_grammar_and_penalties_the_head_changes_nothing(files, runtime, head):
    request: dict[str, object] = {
        "constraint": ConstraintSpec(text=JsonOutput(SCHEMA, strict=True)),
        "params": SamplingParams(presence_penalty=0.8, frequency_penalty=0.4),
    }
    plain, drafted = plain_and_headed(files, runtime, head, head, **request)
    assert tokens(drafted) == tokens(plain)
    head_rounds = [event for event in drafted if head in event.drafter]
    assert head_rounds, f"the {head} head never drafted under the grammar"


@pytest.mark.parametrize(("runtime", "head"), HEADS)
def test_auto_drafts_with_the_head_and_changes_nothing(files, runtime, head):
    plain, drafted = plain_and_headed(files, runtime, head, "auto")
    assert tokens(drafted) == tokens(plain)
    used = {event.drafter for event in drafted}
    assert used & {head, f"ngram+{head}", f"grammar+{head}"}, used


@pytest.mark.parametrize(("runtime", "head"), HEADS)
def test_after_a_prefix_loaded_from_disk_the_head_drafts_and_changes_nothing(
    files, runtime, head, tmp_path
):
    directory = tmp_path / "prefixes"
    # A prompt of two whole blocks and a tail: the first engine saves the blocks.
    long_prompt = [(i * 37) % 4000 + 200 for i in range(2 * BLOCK_TOKENS + 40)]

    def run(make: Callable[[], Engine], drafter: str) -> tuple[list, int]:
        engine = make()
        try:
            events = reply(engine, long_prompt, drafter)
        finally:
            engine.close()  # waits for the prefix writes
        return events, events[-1].stats.cached_prompt_tokens

    def with_prefixes(attached: str | None) -> Callable[[], Engine]:
        return lambda: engine_for(
            files, runtime, attached, prefixes=DiskPrefixes(PrefixStore(directory, 1 << 30))
        )

    read, cached = run(with_prefixes(None), "none")
    assert cached == 0
    loaded, cached = run(with_prefixes(head), head)
    # The target loaded what the first engine read (MLX keeps the prompt but its last token).
    assert cached >= 2 * BLOCK_TOKENS
    assert tokens(loaded) == tokens(read)
    assert any(event.drafter == head for event in loaded), "the head never drafted"


@pytest.mark.parametrize(("runtime", "head"), HEADS)
def test_one_conversation_after_another_the_head_follows_and_changes_nothing(files, runtime, head):
    """On one engine, as a server or the chat app runs it: a reply, then another chat
    that shares only the template's opening with it (the target is cut back deep, past
    the rows the head keeps), then that chat's next turn (cut back a few positions):
    each reply is plain decoding's, the head drafts in each, and the next turn keeps
    the head's entries of the conversation so far (no fresh start)."""
    other = [ChatMessage("user", "Name three rivers in Europe.")]
    plain_engine = engine_for(files, runtime, None)
    engine = engine_for(files, runtime, head)
    try:
        target = plain_engine.target
        second = plain_engine.chat_prompt(other)
        answer = "".join(
            target.token_text(token) for token in tokens(reply(plain_engine, second, "none"))
        )
        turn = [*other, ChatMessage("assistant", answer), ChatMessage("user", "And in Asia?")]
        prompts = [plain_engine.chat_prompt(PROMPT), second, plain_engine.chat_prompt(turn)]
        starts = []
        for prompt in prompts:
            plain = tokens(reply(plain_engine, prompt, "none"))
            drafted = reply(engine, prompt, head)
            assert tokens(drafted) == plain
            assert any(event.drafter == head and event.draft_length for event in drafted)
            starts.append(first_entry(engine, runtime, head))
        assert starts[2] == starts[1], "the next turn started the head afresh"
    finally:
        engine.close()
        plain_engine.close()


def first_entry(engine: Engine, runtime: str, head: str) -> int:
    """The position of the first entry in ``engine``'s head's cache."""
    state = engine.drafter_named(head).head  # type: ignore[attr-defined]
    if runtime == "mlx":
        return int(state._base)
    return int(llamacpp.llama_cpp.llama_memory_seq_pos_min(state._memory, state.seq))
