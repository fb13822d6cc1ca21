"""Drafting with a DFlash or DSpark head: one forward of the head drafts a whole block.

A DFlash head reads the inputs of some of the target's layers at every position and,
given the pending token and mask tokens after it, denoises the block in one forward
(block diffusion); DSpark adds a Markov head over the block. The runtime runs it and
keeps it in step with the target's cache (llama.cpp's in backends/llamacpp/dflash.py);
to the loop it is a :class:`BlockHead`. The block's length is the head's trained one,
cut to the round's draft length. Its rows are then read one after another as
:func:`~backends.speculation.draft_chain.draft_chain` reads a chain's: each shaped by the
grammar and the penalties after the drafts before it, its token the argmax (greedy) or a
sample of the filtered ``q`` (the head's own distribution at that slot), so the loop's
acceptance is exact rejection sampling; the chain stops at an end-of-generation token or
where the head's confidence falls below the floor.
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
from backends.sampling.rows import HostRows, LogitRows
from backends.speculation.draft_chain import draft_chain
from backends.speculation.proposal import EMPTY_PROPOSAL, DraftProposal
from backends.token_prefix import common_prefix_length

# What a target without a head is told (after its name) when asked to draft with one.
NO_BLOCK_HEAD = (
    "has no DFlash or DSpark head loaded. Give the head's GGUF with --target TARGET "
    "--draft HEAD, or pick a pair whose drafter is dflash or dspark."
)


class BlockHead(Protocol):
    """A head that drafts a block in one forward, as a runtime runs it."""

    kind: str  # "dflash" or "dspark"

    @property
    def max_drafts(self) -> int:
        """The most tokens one block drafts."""
        ...

    def draft_block(self, evaluated: int, context: Sequence[int], drafts: int) -> LogitRows | None:
        """Read ``context[evaluated:]`` after the target's cache (``context[:evaluated]``)
        and decode a block: the rows of up to ``drafts`` slots, each for the token after
        the one before; None where the head cannot draft here."""
        ...

    def finish(self) -> None:
        """The round's drafting is over: forget the block's positions."""
        ...


class BlockDrafter:
    """Drafts a block from the target's DFlash or DSpark head (see the module's docstring)."""

    FOLLOWS_GRAMMAR = True  # see ModelDrafter

    def __init__(self, target: Model, head: BlockHead, min_confidence: float = 0.0) -> None:
        self.target = target
        self.head = head
        self.name = head.kind
        self.min_confidence = min_confidence

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
        """Draft up to ``max_tokens`` tokens (and no more than a block) after ``context``,
        the target's cache, its pending token and any tokens the grammar forces."""
        drafts = min(max_tokens, self.head.max_drafts)
        if drafts <= 0:
            return EMPTY_PROPOSAL
        evaluated = len(self.target.cached_tokens)
        if common_prefix_length(self.target.cached_tokens, context) < evaluated:
            return EMPTY_PROPOSAL
        started = time.perf_counter()
        try:
            rows = self.head.draft_block(evaluated, context, drafts)
            block_seconds = time.perf_counter() - started
            if rows is None:
                return EMPTY_PROPOSAL
            slots = _Slots(rows)
            chain = draft_chain(
                slots.row(0),
                slots.after,
                max_tokens=min(drafts, len(rows)),
                params=params,
                rng=rng,
                constraint=constraint,
                penalties=penalties,
                min_confidence=self.min_confidence,
                record_confidence=False,
                is_end=self.target.is_end_of_generation,
            )
        finally:
            self.head.finish()
        # One forward drafted the block: its time is the cost of the round's drafts.
        return DraftProposal(
            tokens=chain.tokens,
            distributions=None if params.greedy else chain.distributions,
            top_probs=chain.top_probs,
            passes=1,
            step_seconds=block_seconds,
            runtime_seconds=block_seconds,
        )


class _Slots:
    """A block's rows handed out one slot at a time, as a chain's steps hand them."""

    def __init__(self, rows: LogitRows) -> None:
        self._rows = rows
        self._next = 1

    def row(self, index: int) -> LogitRows:
        return HostRows(self._rows.row(index)[np.newaxis])

    def after(self, token: int) -> LogitRows:
        """The next slot's row (the block does not read the token drafted before it)."""
        rows = self.row(self._next)
        self._next += 1
        return rows
