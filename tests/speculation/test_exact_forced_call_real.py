"""Issue 39, part 0, on the real starter pair: exact output holds under a forced tool call.

With ``exact_output`` every verify batch must round like one-token decoding, the
grammar's forced tokens included: ``tool_choice`` forcing Write makes the reply open
with 15 forced tokens (``<tool_call>\\n{"name": "Write", "arguments": {"file_path":``).
Verified in one batch of 16, they were cached as llama.cpp's batched kernels round
(measured: the next rows up to 0.54 off in a logit), so every drafter, ``none``
included, wrote from another cache than plain decoding, and a guess that joined a
forced stretch could push a batch past the exact limit in one run and not in another:
long Writes parted at near-ties. The check is bit for bit and needs no long reply:
each drafter's tokens and their log-probabilities equal one-token decoding's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.output.constraints import mask_logits
from backends.sampling.row_scans import log_normaliser
from tests.speculation.forced_write import (
    forced_write_request,
)
from tests.support.model_files import DRAFT_KEY, TARGET_KEY
from tests.support.real_runtimes import load_model


def one_token_decoding(engine: Engine, request: GenerationRequest) -> tuple[list, list]:
    """Greedy decoding under the request's grammar, one forward per token: the tokens
    and each one's log-probability (the masked raw row's log-softmax, as the loop's)."""
    target = engine.target
    prompt = list(request.prompt_tokens)
    target.rollback(len(prompt) - 1)  # the prompt's cells, as the runs left them
    state = engine.grammar_state(request.constraint)
    assert state is not None
    tokens: list[int] = []
    logprobs: list[float] = []
    pending = prompt[-1]
    while len(tokens) < request.max_tokens:
        values = mask_logits(np.array(target.forward([pending])[0]), state.allowed())
        pending = int(np.argmax(values))
        if target.is_end_of_generation(pending):
            break
        tokens.append(pending)
        logprobs.append(float(values[pending]) - log_normaliser(values))
        state.consume([pending])
    return tokens, logprobs


@pytest.mark.real_model
def test_a_forced_write_under_exact_output_is_one_token_decoding_for_every_drafter():
    target = load_model("llamacpp", TARGET_KEY, exact_kernels=True)
    draft = load_model("llamacpp", DRAFT_KEY)
    engine = Engine(target, draft)
    try:
        engine.calibrate()  # the exact batch limit, as serve measures it at load
        request = forced_write_request(engine)
        replies = {}
        for drafter in ("none", "model", "ngram", "auto"):
            events = list(engine.generate(dataclasses.replace(request, drafter=drafter)))
            tokens = [token for event in events for token in event.tokens]
            logprobs = [entry.logprob for event in events for entry in event.token_logprobs]
            replies[drafter] = (tokens, logprobs)
        assert events[-1].stats.grammar_forced > 0
        expected = one_token_decoding(engine, request)
        text = b"".join(target.token_bytes(token) for token in expected[0]).decode()
        assert text.startswith('<tool_call>\n{"name": "Write", "arguments": {"file_path": "')
        for drafter, reply in replies.items():
            assert reply == expected, drafter
    finally:
        engine.close()
