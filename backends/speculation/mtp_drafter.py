"""Drafting with the target's own multi-token-prediction (MTP) head.

Qwen3.5/3.6 and others ship an extra block that predicts one token further from the
target's own hidden state; chained on its own hidden states it drafts several. The
runtime runs it (:class:`DraftHead`, llama.cpp's in backends/llamacpp/mtp.py); this
drafter shapes and samples its rows exactly as
:class:`~backends.speculation.model_drafter.ModelDrafter` does a draft model's, so its
``q`` is the head's own filtered distribution and the loop's acceptance is exact
rejection sampling (``min(1, p/q)`` and the residual), not llama.cpp's
sample-and-match, which accepts less at temperature > 0. It drafts under a grammar
(its rows masked like the target's) and stops a chain where its confidence
falls below the floor the controller learns.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from backends.base import Model
from backends.output.constraints import GrammarState
from backends.sampling.filters import SamplingParams
from backends.sampling.penalties import TokenCounts
from backends.sampling.rows import LogitRows
from backends.speculation.draft_chain import DraftChain, draft_chain
from backends.speculation.proposal import EMPTY_PROPOSAL, DraftProposal
from backends.token_prefix import common_prefix_length

# What a target without a head is told (after its name) when asked to draft with one.
NO_MTP_HEAD = (
    "has no MTP head (no nextn layers in its file). Use a GGUF that keeps them, or "
    "--drafter ngram, model or none."
)


class DraftHead(Protocol):
    """A target's own draft head, as a runtime runs it."""

    def start(self, evaluated: int, context: Sequence[int]) -> LogitRows | None:
        """Read ``context[evaluated:]`` after the target's cache (``context[:evaluated]``);
        the row for the next token, or None where the head cannot draft here."""
        ...

    def step(self, token: int) -> LogitRows:
        """Chain ``token``; the row for the token after it."""
        ...

    def finish(self) -> None:
        """The chain is over: forget its drafted positions."""
        ...


class MtpDrafter:
    """Drafts a chain from the target's MTP head (see the module's docstring)."""

    name = "mtp"
    FOLLOWS_GRAMMAR = True  # see ModelDrafter

    def __init__(
        self,
        target: Model,
        head: DraftHead,
        min_confidence: float = 0.0,
        *,
        record_confidence: bool = False,
    ) -> None:
        self.target = target
        self.head = head
        self.min_confidence = min_confidence
        self.record_confidence = record_confidence

    def with_confidence_floor(self) -> MtpDrafter:
        """A drafter over the same head whose floor its owner sets (and that records)."""
        return MtpDrafter(self.target, self.head, self.min_confidence, record_confidence=True)

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Nothing to reset: the head follows the target's cache."""

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
        """Draft up to ``max_tokens`` tokens after ``context`` by sampling the head's ``q``.

        ``context`` is the target's cache, its pending token and any tokens the grammar
        forces after it (the head reads those too, then drafts).
        """
        if max_tokens <= 0:
            return EMPTY_PROPOSAL
        evaluated = len(self.target.cached_tokens)
        if common_prefix_length(self.target.cached_tokens, context) < evaluated:
            return EMPTY_PROPOSAL

        def draft(head: DraftHead) -> tuple[DraftChain, float] | None:
            started = time.perf_counter()
            rows = head.start(evaluated, context)
            first_seconds = time.perf_counter() - started
            if rows is None:
                return None
            chain = draft_chain(
                rows,
                head.step,
                max_tokens=max_tokens,
                params=params,
                rng=rng,
                constraint=constraint,
                penalties=penalties,
                min_confidence=self.min_confidence,
                record_confidence=self.record_confidence,
                is_end=self.target.is_end_of_generation,
            )
            return chain, first_seconds

        # A sequence of a parallel target works its head on the runtime thread
        # (backends/sequence_head.py): the whole chain, its sampling included, goes
        # there in one trip rather than one a step. Not under a grammar: its masks are
        # computed on this thread, so that other sequences' forwards go on meanwhile.
        within = getattr(self.head, "within", None)
        try:
            drafted = (
                within(draft) if within is not None and constraint is None else draft(self.head)
            )
        finally:
            self.head.finish()
        if drafted is None:
            return EMPTY_PROPOSAL
        chain, first_seconds = drafted
        # The first step also caught the head up with what the target accepted; the
        # chain's one-token steps are its cost per drafted token.
        step_times = chain.step_seconds or [first_seconds]
        return chain.proposal(params, step_times, first_seconds, passes=1)
