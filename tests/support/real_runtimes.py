"""Loading real models on either runtime, and greedy generation helpers for their tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from backends.base import Model
from backends.engine import Engine, GenerationRequest
from backends.generation_events import GenerationEvent
from tests.support.model_files import require_mlx_model, require_model

CONTEXT = 2048

# Batched and single-token evaluations take different kernel paths (llama.cpp's CPU
# backend differs by up to ~0.55 in the logits on the starter pair). Under the default
# load a divergence between speculative and plain greedy output is only acceptable where
# the plain run's two candidates were closer than this.
NEAR_TIE_LOGIT_GAP = 0.75

Token = TypeVar("Token")


def load_model(runtime: str, key: str, *, exact_kernels: bool = False) -> Model:
    """A real model on ``runtime`` (the runtime module is imported only here)."""
    if runtime == "llamacpp":
        from backends.llamacpp.model import LlamaCppModel

        return LlamaCppModel(require_model(key), n_ctx=CONTEXT, exact_kernels=exact_kernels)
    directory = require_mlx_model(key)
    from backends.mlx.model import MlxModel

    return MlxModel(directory, n_ctx=CONTEXT)


def generate(
    engine: Engine,
    prompt: list[int],
    drafter: str,
    k: int,
    max_tokens: int,
    stop=(),
    *,
    exact: bool = True,
) -> tuple[list[int], list[GenerationEvent]]:
    """Greedy generation; (tokens, events). auto keeps to exact batches unless told not to."""
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        max_tokens=max_tokens,
        drafter=drafter,
        draft_tokens=k,
        stop=tuple(stop),
        exact=exact,
    )
    events = list(engine.generate(request))
    return [token for event in events for token in event.tokens], events


def plain_logits_at(model: Model, prefix: list[int]) -> np.ndarray:
    """Logits of a single-token (plain decoding) evaluation after ``prefix``."""
    model.rollback(0)
    model.prefill(prefix[:-1])
    row = model.forward(prefix[-1:])[0].copy()
    model.rollback(0)
    return row


def assert_parts_only_at_a_near_tie(
    plain: Sequence[Token],
    other: Sequence[Token],
    gap_at: Callable[[int, Token], float],
    label: str,
) -> str:
    """Where greedy ``other`` first parts from greedy ``plain`` (plain decoding's tokens),
    plain decoding must have been near a tie: ``gap_at(index, token)`` is plain's logit at
    ``index`` for its own token minus that for ``token``. Returns a line for the report."""
    index = next(i for i, (a, b) in enumerate(zip(plain, other, strict=False)) if a != b)
    gap = gap_at(index, other[index])
    assert abs(gap) < NEAR_TIE_LOGIT_GAP, (
        f"{label} diverged at token {index} where plain decoding was not near a tie (gap {gap:.3f})"
    )
    return f"{label}: token {index} flipped, plain logit gap {gap:.3f}"
