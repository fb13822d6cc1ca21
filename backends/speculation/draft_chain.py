"""A chain of one-token draft steps from a model's rows: the model and MTP drafters'
shared inner loop, under the grammar and the reply's penalties like the target's rows."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from backends.output.constraints import GrammarState, mask_logits
from backends.sampling.filters import SamplingParams, greedy_token
from backends.sampling.penalties import TokenCounts
from backends.sampling.rows import HostRows, LogitRows
from backends.sampling.sparse_distribution import SparseDistribution
from backends.speculation.proposal import DraftProposal


def _shaped(
    rows: LogitRows,
    params: SamplingParams,
    constraint: GrammarState | None,
    penalties: TokenCounts | None,
) -> LogitRows:
    """A draft step's one row with the reply's penalties and the grammar's mask applied.

    Untouched (on the runtime's device, if it has one) when neither applies; else the
    row comes to the host and is changed there, like the target's row for the same
    position will be.
    """
    if penalties is None and constraint is None:
        return rows
    row = rows.row(0)
    if penalties is not None:
        row = penalties.apply(row)
    if constraint is not None and not (params.greedy and constraint.allows(greedy_token(row))):
        # Greedy drafting needs the whole mask only where the row's argmax is refused:
        # in a lazy grammar's free text nearly everything is allowed, and one check
        # costs far less than a mask over the vocabulary.
        row = mask_logits(row, constraint.allowed())
    return HostRows(row[np.newaxis])


@dataclass
class DraftChain:
    """What a chain of one-token draft steps produced (see :func:`draft_chain`)."""

    tokens: list[int] = field(default_factory=list)
    distributions: list[SparseDistribution] = field(default_factory=list)
    top_probs: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    runtime_seconds: float = 0.0  # the steps and ``before_steps``

    def proposal(
        self,
        params: SamplingParams,
        step_times: list[float],
        runtime_seconds: float,
        *,
        passes: int,
    ) -> DraftProposal:
        """The proposal, with the time and passes spent before the chain added."""
        return DraftProposal(
            tokens=self.tokens,
            distributions=None if params.greedy else self.distributions,
            top_probs=self.top_probs,
            passes=passes + len(self.step_seconds),
            step_seconds=sum(step_times) / len(step_times) if step_times else None,
            runtime_seconds=runtime_seconds + self.runtime_seconds,
        )


def draft_chain(
    rows: LogitRows,
    step: Callable[[int], LogitRows],
    *,
    max_tokens: int,
    params: SamplingParams,
    rng: np.random.Generator,
    constraint: GrammarState | None,
    penalties: TokenCounts | None,
    min_confidence: float,
    record_confidence: bool,
    is_end: Callable[[int], bool],
    before_steps: Callable[[], None] | None = None,
) -> DraftChain:
    """Draft token by token from ``rows`` (the row for the first draft), calling
    ``step(token)`` for the row after each drafted token.

    Each row is shaped by the grammar and the penalties after the drafts before it (as
    the target's row for that position will be), then the token is the argmax
    (greedy) or a sample of the filtered ``q``; the chain stops at ``max_tokens``, an
    end-of-generation token, or a token whose confidence falls below
    ``min_confidence`` (not drafted). The grammar state and the penalty counts are
    left as they were found. ``before_steps`` runs once, before the first step.
    """
    chain = DraftChain()
    drafted_under_grammar = 0
    counted: list[int] = []  # drafts added to ``penalties`` for the rows after them
    wanted = min_confidence > 0 or record_confidence
    try:
        while True:
            rows = _shaped(rows, params, constraint, penalties)
            if params.greedy:
                token = rows.greedy(0)
                confidence = rows.top_probability(0, token) if wanted else 1.0
            else:
                q = rows.distribution(0, params)
                token = q.sample(rng)
                chain.distributions.append(q)
                confidence = q.top_prob
            if chain.tokens and confidence < min_confidence:
                if chain.distributions:
                    chain.distributions.pop()
                break
            chain.tokens.append(token)
            chain.top_probs.append(confidence)
            if len(chain.tokens) >= max_tokens or is_end(token):
                break
            if constraint is not None:
                constraint.consume([token])
                drafted_under_grammar += 1
            if penalties is not None:
                penalties.add([token])
                counted.append(token)
            if before_steps is not None and not chain.step_seconds:
                started = time.perf_counter()
                before_steps()
                chain.runtime_seconds += time.perf_counter() - started
            started = time.perf_counter()
            rows = step(token)
            chain.step_seconds.append(time.perf_counter() - started)
            chain.runtime_seconds += chain.step_seconds[-1]
    finally:
        if constraint is not None:
            constraint.rollback(drafted_under_grammar)
        if penalties is not None:
            penalties.remove(counted)
    return chain
