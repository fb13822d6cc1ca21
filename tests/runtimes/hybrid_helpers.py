"""Tiny random-weight ``qwen35`` GGUFs on llama.cpp (``tiny_files``), an engine over them,
and the greedy runs and rollback probes the hybrid-target tests share.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.generation_events import GenerationEvent
from backends.speculation.cost_model import CostModel
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tiny_hybrid import perturbed, tiny_qwen35_tensors, write_tiny_qwen35

llamacpp = pytest.importorskip("backends.llamacpp.model")
LlamaCppModel = llamacpp.LlamaCppModel

CONTEXT = 1024
# A verify costs about one decode here, as on a GPU: "auto" then drafts.
GPU_LIKE_COSTS = {1: 0.010, 2: 0.0102, 3: 0.0104, 4: 0.0106, 5: 0.0108, 8: 0.011, 16: 0.012}


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny hybrid target and its draft (the same weights with noise)."""
    tokenizer = require_model(SMOLLM2_KEY)
    import gguf

    n_vocab = len(gguf.GGUFReader(tokenizer).fields["tokenizer.ggml.tokens"].contents())
    folder = tmp_path_factory.mktemp("tiny-hybrid")
    weights = tiny_qwen35_tensors(n_vocab, seed=1)
    target = write_tiny_qwen35(folder / "tiny-qwen35.gguf", tokenizer, tensors=weights)
    draft = write_tiny_qwen35(
        folder / "tiny-qwen35-draft.gguf",
        tokenizer,
        tensors=perturbed(weights, seed=7, scale=0.1),
    )
    return target, draft


def load(path: Path, **options: object) -> LlamaCppModel:
    return LlamaCppModel(path, n_ctx=CONTEXT, **options)


@pytest.fixture
def engine(tiny_files: tuple[Path, Path]) -> Iterator[Engine]:
    target, draft = tiny_files
    engine = Engine(load(target), load(draft), costs=CostModel(dict(GPU_LIKE_COSTS), 0.001))
    yield engine
    engine.close()


def greedy(
    engine: Engine, prompt: list[int], drafter: str, *, k: int = 4, max_tokens: int = 60
) -> tuple[list[int], list[GenerationEvent]]:
    request = GenerationRequest(
        prompt_tokens=tuple(prompt), max_tokens=max_tokens, drafter=drafter, draft_tokens=k
    )
    events = list(engine.generate(request))
    return [token for event in events for token in event.tokens], events


def deepest_rejection(events: list[GenerationEvent]) -> int:
    """The most drafts one round had rejected (and so rolled back in the target)."""
    return max(
        (event.draft_length - sum(event.from_draft) for event in events if event.draft_length),
        default=0,
    )


def cut_back_a_batch(model) -> tuple[list[int], list[int], list[np.ndarray]]:
    """Plain decoding's rows for 6 tokens after an 8-token prompt; then the cache cut
    back to the prompt, the 6 tokens read in one batch and the last 4 of them dropped.
    Returns the prompt, the tokens after it and the reference rows."""
    tokens = model.tokenize("The sea is wide and the waves are high, the wind is strong")
    prompt, rest = tokens[:8], tokens[8:]
    model.prefill(prompt)
    reference = [np.array(model.forward([token])[0]) for token in rest[:6]]
    model.rollback(len(prompt))
    model.forward(rest[:6])
    model.rollback(len(prompt) + 2)  # drop 4 of the batch
    return prompt, rest, reference
