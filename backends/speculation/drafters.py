"""Where draft tokens come from.

A drafter looks at the committed context (prompt + accepted output, ending with the
token the target will evaluate next) and proposes up to ``max_tokens`` continuation
tokens, each with the distribution ``q`` it was drawn from. Three kinds:

- :class:`ModelDrafter`: a small language model sharing the target's tokenizer;
  samples from its own filtered distribution, keeps its KV cache in step with the
  committed context.
- :class:`~backends.speculation.ngram_drafter.NgramDrafter` (its own module): prompt lookup; finds
  the latest earlier occurrence of the context's last n tokens and proposes what
  followed it. Costs nearly nothing; its ``q`` is a point mass, so the target accepts
  a token with probability ``p(x)``.
- :class:`PredictionDrafter`: the caller says what the output will probably be
  (OpenAI's Predicted Outputs); proposes the next stretch of that text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from backends.base import Model, keep_rollback_point
from backends.output.constraints import GrammarState, mask_logits
from backends.sampling.filters import SamplingParams, greedy_token
from backends.sampling.penalties import TokenCounts
from backends.sampling.rows import HostRows, LogitRows, forward_rows
from backends.sampling.sparse_distribution import SparseDistribution


@dataclass(frozen=True)
class DraftProposal:
    """Draft tokens and, for sampled drafts, the distribution each was drawn from.

    ``distributions`` is None when every token is a point mass (n-gram, prediction,
    or a model drafting greedily); the loop then treats each ``q`` as one-hot.
    ``top_probs`` holds the drafter's own confidence in each token where it has one.
    ``step_seconds`` is the mean time of the one-token forwards a model drafter made;
    a first forward that caught its cache up on several tokens is left out of it.
    ``runtime_seconds`` is all the time spent inside the draft model's forward and
    rollback calls (catch-up included), so the loop can tell host time from runtime.
    """

    tokens: list[int]
    distributions: list[SparseDistribution] | None = None
    top_probs: list[float] = field(default_factory=list)
    passes: int = 0
    step_seconds: float | None = None
    runtime_seconds: float = 0.0


EMPTY_PROPOSAL = DraftProposal(tokens=[])

# A draft model that must catch up on more tokens than this (a new prompt) reads all but
# the last as a prompt, without logits; fewer (the rounds since its last proposal) go
# in one forward with the pending token.
READ_AS_PROMPT = 64


class Drafter(Protocol):
    """Anything that proposes draft tokens."""

    name: str

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Start a new generation whose context begins with ``prompt_tokens``."""
        ...

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> DraftProposal:
        """Up to ``max_tokens`` tokens that may follow ``context``."""
        ...


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


def common_prefix_length(left: Sequence[int], right: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    limit = min(len(left), len(right))
    # One comparison of the whole prefix settles the usual case (a context that grew
    # by appends); slices only where a sequence is longer, lists compared as lists.
    head_left = left if len(left) == limit else left[:limit]
    head_right = right if len(right) == limit else right[:limit]
    if type(head_left) is type(head_right):
        same = head_left == head_right
    else:
        same = list(head_left) == list(head_right)
    if same:
        return limit
    index = 0
    while index < limit and left[index] == right[index]:
        index += 1
    return index


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


class PredictionDrafter:
    """Drafts from a caller-supplied prediction of the output.

    Follows the prediction with a cursor: while the output agrees with it, the next
    stretch after the cursor is proposed; after a divergence, the output's last
    tokens are looked up in the prediction (n-gram match) to find where to resume.
    """

    name = "prediction"

    def __init__(self, prediction_tokens: Sequence[int], sizes: Sequence[int] = (8, 4, 2, 1)):
        self.prediction = list(prediction_tokens)
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        self._prompt_length = 0
        self._anchor_output = 0
        self._anchor_prediction = 0
        self._positions: dict[tuple[int, ...], list[int]] = {}
        for size in self.sizes:
            for end in range(size - 1, len(self.prediction)):
                key = tuple(self.prediction[end + 1 - size : end + 1])
                self._positions.setdefault(key, []).append(end)

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """The output starts right after the prompt; the prediction from its start."""
        self._prompt_length = len(prompt_tokens)
        self._anchor_output = 0
        self._anchor_prediction = 0

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> DraftProposal:
        """The next stretch of the prediction after the output so far."""
        if max_tokens <= 0 or not self.prediction:
            return EMPTY_PROPOSAL
        output = context[self._prompt_length :]
        start = self._locate(output)
        if start is None or start >= len(self.prediction):
            return EMPTY_PROPOSAL
        self._anchor_output, self._anchor_prediction = len(output), start
        return DraftProposal(tokens=self.prediction[start : start + max_tokens])

    def _locate(self, output: Sequence[int]) -> int | None:
        """Index in the prediction of the token expected next, or None."""
        if not output:
            return 0
        # Fast path: since the last proposal the output kept following the prediction.
        grown = len(output) - self._anchor_output
        followed = self._anchor_prediction  # the output has written the prediction up to here
        if grown >= 0:
            expected = self.prediction[self._anchor_prediction : self._anchor_prediction + grown]
            if len(expected) == grown and list(output[self._anchor_output :]) == expected:
                return self._anchor_prediction + grown
            followed += common_prefix_length(output[self._anchor_output :], expected)
        for size in self.sizes:
            if len(output) < size:
                continue
            ends = self._positions.get(tuple(output[-size:]))
            if not ends:
                continue
            # Prefer the first occurrence after what the output already followed:
            # predictions are followed front to back.
            later = [end for end in ends if end + 1 >= followed]
            end = later[0] if later else ends[-1]
            if end + 1 < len(self.prediction):
                return end + 1
        return None
