"""Drafts from a small language model that shares the target's tokenizer."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from backends.base import Model, keep_rollback_point
from backends.output.constraints import GrammarState
from backends.sampling.filters import SamplingParams
from backends.sampling.penalties import TokenCounts
from backends.sampling.rows import forward_rows
from backends.speculation.draft_chain import draft_chain
from backends.speculation.proposal import EMPTY_PROPOSAL, DraftProposal
from backends.token_prefix import common_prefix_length

# A draft model that must catch up on more tokens than this (a new prompt) reads all but
# the last as a prompt, without logits; fewer (the rounds since its last proposal) go
# in one forward with the pending token.
READ_AS_PROMPT = 64


class ModelDrafter:
    """Drafts with a small model that shares the target's tokenizer.

    Its cache follows the committed context lazily: each proposal first trims the
    cache back to the longest prefix it shares with the context (dropping rejected
    drafts), evaluates the missing tokens in one pass, then drafts token by token.
    An optional confidence floor stops drafting where the draft itself is unsure;
    ``record_confidence`` reports each token's confidence even without a floor (the
    adaptive policy learns the floor from them).
    """

    name = "model"
    # It drafts under a grammar and the reply's penalties (its q transformed like the
    # target's p), so ``propose`` takes a ``constraint`` and ``penalties``; drafters
    # without this flag are cut to the grammar's valid prefix by the loop instead,
    # and need no penalties (their q is a point mass).
    FOLLOWS_GRAMMAR = True

    def __init__(
        self, model: Model, min_confidence: float = 0.0, *, record_confidence: bool = False
    ) -> None:
        self.model = model
        self.min_confidence = min_confidence
        self.record_confidence = record_confidence

    def with_confidence_floor(self) -> ModelDrafter:
        """A drafter over the same model whose floor its owner sets (and that records)."""
        return ModelDrafter(self.model, self.min_confidence, record_confidence=True)

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Nothing to reset: the cache syncs by common prefix on the next proposal."""

    def unread(self, context: Sequence[int]) -> int:
        """Tokens of ``context`` its next proposal would first have to read: those
        before the pending token that the model's cache does not hold (a new prompt,
        rounds it sat out). The pending token is read by every proposal's first step."""
        return max(0, len(context) - 1 - common_prefix_length(self.model.cached_tokens, context))

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        constraint: GrammarState | None = None,
        penalties: TokenCounts | None = None,
    ) -> DraftProposal:
        """Draft up to ``max_tokens`` tokens by sampling the draft model's ``q``.

        Under a ``constraint`` each row is masked by the grammar's state after the
        tokens drafted before it, and with ``penalties`` penalised by the reply's
        counts plus those drafts, as the target's row for the same position will be;
        the state and the counts are left as they were found.
        """
        if max_tokens <= 0 or not context:
            return EMPTY_PROPOSAL
        model = self.model
        keep = min(common_prefix_length(model.cached_tokens, context), len(context) - 1)
        rollback_started = time.perf_counter()
        model.rollback(keep)
        missing = context[keep:]
        read = len(missing)
        if read > READ_AS_PROMPT:
            # A long catch-up (a prompt) is read as the target reads one: a parallel
            # context then reads it in pieces beside the other sequences' rounds
            # (backends/llamacpp/decode_batcher.py), where one forward of it would
            # hold their rounds up for its whole length.
            model.prefill(missing[:-1])
            missing = missing[-1:]
        started = time.perf_counter()
        rows = forward_rows(model, missing, last_only=True)
        finished = time.perf_counter()
        runtime_seconds = finished - rollback_started
        # A catch-up over many tokens (a reply's first model round feeds the whole
        # prompt) is not a draft step: timing it as one would make the draft look slow.
        step_times = [finished - started] if read == 1 else []
        chain = draft_chain(
            rows,
            lambda token: forward_rows(model, [token], last_only=True),
            max_tokens=max_tokens,
            params=params,
            rng=rng,
            constraint=constraint,
            penalties=penalties,
            min_confidence=self.min_confidence,
            record_confidence=self.record_confidence,
            is_end=model.is_end_of_generation,
            # The chain is partly undone next round, back to here at the earliest: a
            # model with a recurrent state keeps a copy of it (a KV cache needs none).
            before_steps=lambda: keep_rollback_point(model),
        )
        step_times = step_times + chain.step_seconds
        return chain.proposal(params, step_times, runtime_seconds, passes=1)
