"""Several sequences at once on the MLX runtime (issue 37, part 5), on Linux's MLX CPU.

The real views, batcher, exchange and slots, with their threads, over a tiny
random-weight llama (SmolLM2's tokenizer) so a forward takes milliseconds. The draft
is the target with its weights perturbed, so its drafts are partly accepted: rounds
verify, reject and roll back beside each other.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.engine import Engine, GenerationRequest
from backends.engine_slots import EngineSlots, generate_on_slot, parallel_of
from backends.runtime_exchange import RuntimeExchange
from backends.sampling.filters import SamplingParams
from backends.speculation.acceptance import AcceptanceEstimate
from backends.speculation.cost_model import CostModel
from backends.speculation.draft_policy import FIRST_ROUND_REASON
from backends.speculation.model_drafter import READ_AS_PROMPT
from tests.runtimes.tiny_llama_mlx import (
    _tiny_llama,
)

pytest.importorskip("mlx_lm")

pytestmark = pytest.mark.real_model


PROMPTS = (
    "def fibonacci(n):\n",
    "Once upon a time, in a village by the sea, there lived",
    "The capital of France is",
)
MAX_TOKENS = 20
# An agent's prompt in small: longer than a draft model's catch-up in one forward.
LONG_PROMPT = (
    "You are a coding agent. Read the repository, find where the speculative loop "
    "lives, explain how the first token of a reply is produced, and then list every "
    "module that imports the runtime directly, with one sentence about each module's "
    "purpose, its size in lines, and whether its tests use fake models or real ones. "
    "Keep the answer short: one line per module, no code, and no guesses about files "
    "that you have not opened yourself."
)


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("mlx-parallel")
    target = _tiny_llama(root / "target", seed=1)
    return target, _tiny_llama(root / "draft", seed=2, like=target)


def _engine(dirs: tuple[Path, Path], parallel: int, *, exact: bool = True) -> Engine:
    from backends.mlx.model import MlxModel

    models = [MlxModel(path, n_ctx=256, parallel=parallel, exact_output=exact) for path in dirs]
    engine = Engine(models[0], models[1])
    # As calibrated on a CPU where batches up to 8 round like one-token decoding.
    engine.costs = CostModel({1: 0.01, 8: 0.02}, 0.005, exact_batch_limit=8)
    return engine


def _request(engine: Engine, prompt: str) -> GenerationRequest:
    return GenerationRequest(
        tuple(engine.text_prompt(prompt)),
        params=SamplingParams(temperature=0.0),
        max_tokens=MAX_TOKENS,
        drafter="model",
        draft_tokens=3,
        exact=True,
    )


def _tokens(events: Iterator[Any]) -> list[int]:
    return [token for event in events for token in event.tokens]


@pytest.fixture(scope="module")
def alone(pair_dirs: tuple[Path, Path]) -> dict[str, list[int]]:
    """Each prompt's greedy reply from an engine of one sequence."""
    engine = _engine(pair_dirs, 1)
    replies = {prompt: _tokens(engine.generate(_request(engine, prompt))) for prompt in PROMPTS}
    engine.close()
    return replies


@pytest.fixture
def served(pair_dirs: tuple[Path, Path]) -> Iterator[tuple[Engine, EngineSlots]]:
    """A parallel engine's slots, with a runtime thread serving the exchange."""
    exchange = RuntimeExchange()
    stop = threading.Event()
    runtime = threading.Thread(target=exchange.serve, args=(stop,), daemon=True)
    runtime.start()
    engine = _engine(pair_dirs, len(PROMPTS))
    slots = EngineSlots(engine, exchange)
    yield engine, slots
    exchange.stop_serving(stop)
    runtime.join(timeout=10)
    slots.close()
    engine.close()


def _run_together(
    slots: EngineSlots, engine: Engine, prompts: tuple[str, ...], cancels: dict[str, Any]
) -> dict[str, list[int]]:
    replies: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    taken = [slots.take(engine.text_prompt(prompt)) for prompt in prompts]

    def run(slot: Engine, prompt: str) -> None:
        cancel = cancels.get(prompt)
        try:
            tokens: list[int] = []
            for event in generate_on_slot(slot, _request(slot, prompt), cancel):
                tokens.extend(event.tokens)
                if cancel is not None and len(tokens) >= 4:
                    cancel.set()  # its client went away mid-reply
            replies[prompt] = tokens
        except BaseException as error:  # re-raised by the test
            errors.append(error)
        finally:
            slots.give_back(slot)

    threads = [threading.Thread(target=run, args=pair) for pair in zip(taken, prompts, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return replies


def test_beside_others_the_first_token_comes_before_the_draft_model_reads_the_prompt(
    pair_dirs: tuple[Path, Path],
) -> None:
    # Figures under which `auto` drafts with the draft model, held as given.
    from tests.speculation.held_costs import GPU_COSTS, GPU_DRAFT_STEP, HeldCosts

    exchange = RuntimeExchange()
    stop = threading.Event()
    runtime = threading.Thread(target=exchange.serve, args=(stop,), daemon=True)
    runtime.start()
    engine = _engine(pair_dirs, 2, exact=False)
    engine.costs = HeldCosts(dict(GPU_COSTS), GPU_DRAFT_STEP)
    memory = {"model": AcceptanceEstimate(0.95)}
    memory.update({f"ngram:{n}": AcceptanceEstimate(0.0) for n in (2, 3, 4, 6, 8, "text")})
    engine.use_acceptance_memory(memory)
    slots = EngineSlots(engine, exchange)
    try:
        prompt = engine.text_prompt(LONG_PROMPT)
        assert READ_AS_PROMPT < len(prompt) < 200
        slot = slots.take(prompt)
        request = GenerationRequest(tuple(prompt), params=SamplingParams(), max_tokens=20)
        events = generate_on_slot(slot, request)
        first = next(events)
        assert first.tokens and first.draft_length == 0 and first.decision == FIRST_ROUND_REASON
        assert slot.draft is not None and len(slot.draft.cached_tokens) == 0
        rest = list(events)
        assert any(event.drafter == "model" and event.draft_length for event in rest)
        assert list(slot.draft.cached_tokens[: len(prompt)]) == prompt
        slots.give_back(slot)
    finally:
        exchange.stop_serving(stop)
        runtime.join(timeout=10)
        slots.close()
        engine.close()


def test_parallel_of_gives_mlx_its_sequences(pair_dirs: tuple[Path, Path]) -> None:
    engine = _engine(pair_dirs, 3)
    assert parallel_of(engine, 3) == (3, None)
    engine.close()


def test_a_hybrid_target_says_why_it_runs_one_sequence() -> None:
    from backends.mlx.model import _parallel_refusal

    assert _parallel_refusal(False, 4) is None
    assert "one sequence at a time" in (_parallel_refusal(True, 4) or "")
    assert _parallel_refusal(True, 1) is None


def test_each_greedy_reply_beside_others_is_its_reply_alone(
    served: tuple[Engine, EngineSlots], alone: dict[str, list[int]]
) -> None:
    engine, slots = served
    replies = _run_together(slots, engine, PROMPTS, {})
    assert replies == alone
    assert all(len(reply) == MAX_TOKENS for reply in replies.values())
    target_batcher = slots._target_views.batcher
    assert target_batcher.gathers  # this family's attention runs per sequence
    if target_batcher.batch_exact:  # measured on the loaded model (MLX's CPU: exact)
        assert target_batcher.gathered > 0, "rounds shared forwards"
    assert slots._draft_views is not None and slots._draft_views.batcher.gathered > 0


def test_a_cancelled_sequence_is_freed_and_disturbs_no_other(
    served: tuple[Engine, EngineSlots], alone: dict[str, list[int]]
) -> None:
    engine, slots = served
    cancelled = PROMPTS[1]
    replies = _run_together(slots, engine, PROMPTS, {cancelled: threading.Event()})
    assert len(replies[cancelled]) < MAX_TOKENS
    assert replies[cancelled] == alone[cancelled][: len(replies[cancelled])]
    for prompt in PROMPTS:
        if prompt != cancelled:
            assert replies[prompt] == alone[prompt]
    assert slots._target_views.batcher.generating_count() == 0  # nobody waits for it
    # Its slot serves the next request as if nothing had happened.
    again = _run_together(slots, engine, (cancelled,), {})
    assert again[cancelled] == alone[cancelled]


def test_the_probe_sends_a_family_it_cannot_gather_to_run_in_turn(
    pair_dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from backends.mlx import sequences
    from backends.mlx.model import MlxModel

    model = MlxModel(pair_dirs[0], n_ctx=64)
    assert sequences.rounds_as_alone(model._model) is True  # MLX's CPU: bit for bit
    real = sequences.forward_together

    def misplaced(*args: Any) -> Any:  # as a family whose positions went wrong would
        return real(*args) * -1.0

    monkeypatch.setattr(sequences, "forward_together", misplaced)
    assert sequences.rounds_as_alone(model._model) is None

    def refused(*args: Any) -> Any:
        raise ValueError("this family reads its cache's offset as a number")

    monkeypatch.setattr(sequences, "forward_together", refused)
    assert sequences.rounds_as_alone(model._model) is None
    model.close()


def test_a_long_prompt_reads_short_chunks_while_another_sequence_generates():
    from backends.mlx.forward_batcher import MIN_BESIDE, ForwardBatcher  # imports mlx

    arriving = threading.Event()
    batcher = ForwardBatcher(
        None,
        name="chunks",
        condition=threading.Condition(),
        gathers=False,
        arriving=arriving.is_set,
    )
    batcher._seconds_per_token = 0.002  # 250 tokens in PROMPT_SECONDS
    batcher._round_seconds = 0.02  # a round of the others: 20 tokens' worth
    batcher.generating(0, True)
    alone = batcher.prompt_chunk(0)
    assert alone == 250
    batcher.generating(1, True)  # a chat: its rounds take turns with the chunks
    assert batcher.prompt_chunk(0) == 20  # two rounds' worth
    batcher._round_seconds = 0.002
    assert batcher.prompt_chunk(0) == MIN_BESIDE  # never fewer
    batcher.generating(1, False)
    assert batcher.prompt_chunk(0) == alone
    arriving.set()  # a request on its way to a free slot
    assert batcher.prompt_chunk(0) < alone
