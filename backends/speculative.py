"""THE speculative decoding loop. Every consumer (TUI, server, generate, bench) uses it.

One round: a drafter proposes up to K tokens (with their draft distributions q); the
target evaluates ``[pending] + drafts`` in ONE forward pass; each draft token is
accepted with probability min(1, p/q), and the first rejection is replaced by a token
sampled from normalize(max(p - q, 0)); when all K pass, a bonus token is sampled from
the target's last row. At temperature 0 acceptance is exact argmax equality, so the
output is token for token what the target alone would write. The target's cache is
rolled back to the accepted prefix at once; a draft model's cache follows lazily on
its next proposal.

With ``logprobs`` requested, each emitted token carries the target's own log-probability
of it (and of its most likely alternatives), read from the target's row at that
position: speculation changes which forward computed a row, never its values.

K = 0 is plain autoregressive decoding through the same code. A :class:`DraftPolicy`
chooses the drafter and K before each round; the fixed policy here is the baseline,
an adaptive one can measure costs and acceptance and choose per round.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from backends.base import IncrementalDetokenizer, Model, reusable_prefix, rollback_limit
from backends.constraints import GrammarState, mask_logits
from backends.drafters import EMPTY_PROPOSAL, Drafter, DraftProposal, common_prefix_length
from backends.errors import ContextOverflowError
from backends.penalties import TokenCounts
from backends.rejection import verify_draft_token
from backends.row_scans import log_normaliser, top_ids
from backends.rows import LogitRows, forward_rows
from backends.sampling import SamplingParams, distribution, greedy_token
from backends.sparse_distribution import SparseDistribution

# Finish reasons, as OpenAI names them where it has a name.
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_CANCELLED = "cancelled"


def speedup_over_plain_rounds(
    generated_tokens: int, decode_seconds: float, plain_rounds: int, plain_round_seconds: float
) -> float | None:
    """Tokens at the pace of the draft-free rounds, over the time they actually took.

    None when there is no draft-free round (or no time) to compare with.
    """
    if not plain_rounds or not decode_seconds:
        return None
    return generated_tokens * (plain_round_seconds / plain_rounds) / decode_seconds


@dataclass(frozen=True)
class SpeculativeStats:
    """Running totals of one generation. Frozen: each event carries a snapshot."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    rounds: int = 0
    speculative_rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_length_histogram: tuple[int, ...] = ()
    target_passes: int = 0
    draft_passes: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    time_to_first_token: float = 0.0
    # Rounds that drafted nothing (one-token forwards), and their wall time from the
    # end of the round before: plain decoding timed inside this very generation.
    plain_rounds: int = 0
    plain_round_seconds: float = 0.0
    # Decode time spent outside the runtimes' forward and rollback calls (target and
    # draft): the loop's own cost (sampling, drafter bookkeeping, the policy, text),
    # plus whatever a consumer running in the same thread does between events.
    # Tokens the grammar forced (its only continuation), verified as free drafts;
    # counted apart from drafted/accepted, which are the drafters' guesses.
    grammar_forced: int = 0
    host_seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over drafted ones (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens accepted per round that drafted anything."""
        return self.accepted / self.speculative_rounds if self.speculative_rounds else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """Generated tokens per target forward pass (1.0 for plain decoding)."""
        return self.generated_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Generated tokens over decode time (prefill excluded)."""
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def host_ms_per_token(self) -> float:
        """Milliseconds of host time (see ``host_seconds``) per generated token."""
        return 1e3 * self.host_seconds / self.generated_tokens if self.generated_tokens else 0.0

    def as_dict(self) -> dict[str, object]:
        """Plain data for JSON output, including the derived rates."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "rounds": self.rounds,
            "speculative_rounds": self.speculative_rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "accepted_length_histogram": list(self.accepted_length_histogram),
            "target_passes": self.target_passes,
            "draft_passes": self.draft_passes,
            "tokens_per_target_pass": round(self.tokens_per_target_pass, 4),
            "prefill_seconds": round(self.prefill_seconds, 4),
            "decode_seconds": round(self.decode_seconds, 4),
            "decode_tokens_per_second": round(self.decode_tokens_per_second, 3),
            "time_to_first_token": round(self.time_to_first_token, 4),
            "plain_rounds": self.plain_rounds,
            "plain_round_seconds": round(self.plain_round_seconds, 4),
            "grammar_forced": self.grammar_forced,
            "host_seconds": round(self.host_seconds, 6),
            "host_ms_per_token": round(self.host_ms_per_token, 4),
        }


@dataclass(frozen=True)
class TextSegment:
    """A run of output text and whether its tokens were accepted from the draft."""

    text: str
    from_draft: bool


# At most this many alternatives per token (OpenAI's limit for top_logprobs).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of an emitted token, and of its likeliest alternatives.

    At temperature > 0 the distribution is the one the loop samples from (after
    temperature, top-k, top-p and min-p, and the grammar's mask); at temperature 0 it
    is the softmax of the (masked) raw row, as OpenAI and llama.cpp report. Presence
    and frequency penalties are part of both. ``top`` holds exactly N (token, logprob)
    pairs, most likely first; where the filters or the grammar left fewer than N
    possible tokens, the likeliest of the others follow at -inf.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class GenerationEvent:
    """What one round produced: new tokens and text, with provenance and stats.

    ``segments`` concatenate to ``text``; text that might be the start of a stop
    string is held back until it is known not to be one. The last event of a
    generation has a ``finish_reason``.
    """

    text: str
    segments: tuple[TextSegment, ...]
    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]
    drafter: str
    draft_length: int
    stats: SpeculativeStats
    finish_reason: str | None = None
    estimated_speedup: float = 1.0
    decision: str = ""
    # One per token in ``tokens`` when the generation asked for logprobs; else empty.
    token_logprobs: tuple[TokenLogprob, ...] = ()
    # The stop string that ended the generation (finish_reason "stop"); None when an
    # end-of-generation token, a limit or a cancel ended it, or it goes on.
    stop_sequence: str | None = None


@dataclass(frozen=True)
class RoundPlan:
    """What a policy chose for the next round."""

    drafter: Drafter | None
    draft_length: int
    estimated_speedup: float = 1.0
    reason: str = ""


@dataclass(frozen=True)
class RoundOutcome:
    """What happened in a round, for a policy to learn from."""

    drafter: str
    drafted: int
    accepted: int
    verify_seconds: float
    emitted: int
    # The drafter's own confidence in each drafted token, where it reports one.
    draft_confidences: tuple[float, ...] = ()
    # Mean time of a one-token draft-model step this round (None: none was timed).
    draft_step_seconds: float | None = None
    # Tokens verified in the batch besides the pending one and ``drafted``: the
    # grammar's forced tokens (and guesses that were not judged). The batch held
    # ``1 + drafted + other_verified`` tokens.
    other_verified: int = 0


class DraftPolicy(Protocol):
    """Chooses the drafter and draft length for each round.

    A policy whose class sets ``LEARNS = False`` is not told about finished rounds
    (``observe`` is not called): describing one costs host time every round.
    """

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """A new generation starts."""
        ...

    def plan(self, context: Sequence[int]) -> RoundPlan:
        """The drafter and K for the next round (K = 0: plain decoding)."""
        ...

    def observe(self, outcome: RoundOutcome) -> None:
        """Learn from a finished round."""
        ...


class FixedDraftPolicy:
    """Always the same drafter and K (K = 0 or no drafter: plain decoding)."""

    # It learns nothing from a round, so the loop need not describe one to it.
    LEARNS = False

    def __init__(self, drafter: Drafter | None, draft_length: int) -> None:
        self.drafter = drafter if draft_length > 0 else None
        self.draft_length = draft_length if drafter is not None else 0
        self._plan = RoundPlan(self.drafter, self.draft_length)

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Tell the drafter a new generation starts."""
        if self.drafter is not None:
            self.drafter.begin(prompt_tokens)

    def plan(self, context: Sequence[int]) -> RoundPlan:
        """The fixed choice (one plan, made once)."""
        return self._plan

    def observe(self, outcome: RoundOutcome) -> None:
        """A fixed policy learns nothing."""


@dataclass
class _StatsAccumulator:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    rounds: int = 0
    speculative_rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    histogram: list[int] = field(default_factory=list)
    target_passes: int = 0
    draft_passes: int = 0
    prefill_seconds: float = 0.0
    decode_started: float = 0.0
    decode_seconds: float = 0.0
    time_to_first_token: float = 0.0
    plain_rounds: int = 0
    plain_round_seconds: float = 0.0
    runtime_seconds: float = 0.0  # inside target and draft forward/rollback, during decode
    grammar_forced: int = 0

    def record_accepted_length(self, accepted: int) -> None:
        while len(self.histogram) <= accepted:
            self.histogram.append(0)
        self.histogram[accepted] += 1

    def snapshot(self) -> SpeculativeStats:
        return SpeculativeStats(
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            generated_tokens=self.generated_tokens,
            rounds=self.rounds,
            speculative_rounds=self.speculative_rounds,
            drafted=self.drafted,
            accepted=self.accepted,
            accepted_length_histogram=tuple(self.histogram),
            target_passes=self.target_passes,
            draft_passes=self.draft_passes,
            prefill_seconds=self.prefill_seconds,
            decode_seconds=self.decode_seconds,
            time_to_first_token=self.time_to_first_token,
            plain_rounds=self.plain_rounds,
            plain_round_seconds=self.plain_round_seconds,
            grammar_forced=self.grammar_forced,
            host_seconds=max(0.0, self.decode_seconds - self.runtime_seconds),
        )


class StopStringFilter:
    """Holds back text that may be the start of a stop string; cuts at a full match."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = [s for s in stop if s]
        # The stop string found, once one was (the earliest in the text).
        self.matched: str | None = None
        self._held: list[TextSegment] = []
        self._longest = max((len(s) for s in self.stop), default=0)

    def push(self, segments: Sequence[TextSegment]) -> tuple[list[TextSegment], bool]:
        """Add text; return what is safe to show and whether a stop string matched."""
        if not self.stop:
            return list(segments), False
        self._held.extend(s for s in segments if s.text)
        held_text = "".join(s.text for s in self._held)
        cut = _earliest_match(held_text, self.stop)
        if cut is not None:
            self.matched = next(s for s in self.stop if held_text.find(s) == cut)
            shown = _take_chars(self._held, cut)
            self._held = []
            return shown, True
        safe = len(held_text) - _longest_stop_prefix_suffix(held_text, self.stop)
        shown = _take_chars(self._held, safe)
        self._held = _drop_chars(self._held, safe)
        return shown, False

    def flush(self) -> list[TextSegment]:
        """Release held text at the end of generation (no stop string followed)."""
        held, self._held = self._held, []
        return held


def _earliest_match(text: str, stops: Sequence[str]) -> int | None:
    positions = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(positions) if positions else None


def _longest_stop_prefix_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:length]):
                best = length
                break
    return best


def _take_chars(segments: Sequence[TextSegment], count: int) -> list[TextSegment]:
    taken: list[TextSegment] = []
    for segment in segments:
        if count <= 0:
            break
        part = segment.text[:count]
        taken.append(TextSegment(part, segment.from_draft))
        count -= len(part)
    return taken


def _drop_chars(segments: Sequence[TextSegment], count: int) -> list[TextSegment]:
    kept: list[TextSegment] = []
    for segment in segments:
        if count >= len(segment.text):
            count -= len(segment.text)
            continue
        kept.append(TextSegment(segment.text[count:], segment.from_draft))
        count = 0
    return kept


def _merge_segments(segments: Sequence[TextSegment]) -> tuple[TextSegment, ...]:
    merged: list[TextSegment] = []
    for segment in segments:
        if not segment.text:
            continue
        if merged and merged[-1].from_draft == segment.from_draft:
            merged[-1] = TextSegment(merged[-1].text + segment.text, segment.from_draft)
        else:
            merged.append(segment)
    return tuple(merged)


def speculative_generate(
    target: Model,
    prompt_tokens: Sequence[int],
    *,
    policy: DraftPolicy,
    params: SamplingParams,
    max_tokens: int,
    stop: Sequence[str] = (),
    cancel: threading.Event | None = None,
    constraint: GrammarState | None = None,
    logprobs: int | None = None,
    prepare_cache: Callable[[Sequence[int]], None] | None = None,
) -> Iterator[GenerationEvent]:
    """Generate from ``prompt_tokens``, yielding one event per round.

    With a ``constraint`` (a grammar state at the start of the output) every row of
    the target and of the draft model is masked by the grammar's state after the
    tokens before it, the same mask for p and q, so the output is distributed exactly
    as constrained plain decoding. Where the grammar allows one continuation only,
    those tokens are this round's drafts ("grammar"): free, and accepted by
    construction.

    The target's cache is reused where it already holds a prefix of the prompt (a
    chat's earlier turns); ``prepare_cache(prompt_tokens)``, when given, runs first and
    may put a better starting state into the caches (a kept conversation, see
    ``backends/conversation_cache.py``); its time counts as reading the prompt.

    Stops at an end-of-generation token, a stop string (which is not shown),
    ``max_tokens``, a full context, or when ``cancel`` is set (checked between
    rounds). Raises :class:`ContextOverflowError` if the prompt does not fit.

    ``logprobs`` (None: off; N in 0..20) adds to each event a :class:`TokenLogprob`
    per token, with the N most likely alternatives. They are computed from the
    target's rows only when asked for, since they cost host time per token.
    """
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs must be in 0..{MAX_TOP_LOGPROBS} (or None for none)")
    if not prompt_tokens:
        raise ValueError("the prompt is empty")
    if len(prompt_tokens) >= target.n_ctx:
        raise ContextOverflowError(
            f"The prompt is {len(prompt_tokens)} tokens but the context holds "
            f"{target.n_ctx}. Shorten the prompt or start with a larger --context."
        )
    rng = np.random.default_rng(params.seed)
    stats = _StatsAccumulator(prompt_tokens=len(prompt_tokens))
    started = time.perf_counter()
    if prepare_cache is not None:
        prepare_cache(prompt_tokens)

    # Prefill everything but the last prompt token, without logits; that token is the
    # first round's "pending" token, evaluated together with the first drafts.
    cached = list(target.cached_tokens)
    reuse = min(common_prefix_length(cached, prompt_tokens), len(prompt_tokens) - 1)
    # A recurrent state cut back this far keeps less than the shared prefix; the rest
    # is read again (counted as read, not as reused).
    stats.cached_prompt_tokens = reusable_prefix(target, reuse)
    target.rollback(reuse)
    if len(prompt_tokens) - 1 > reuse:
        target.prefill(prompt_tokens[reuse:-1])
    stats.prefill_seconds = time.perf_counter() - started
    stats.decode_started = time.perf_counter()
    previous_round_end = stats.decode_started

    policy.begin(prompt_tokens)
    context = list(prompt_tokens)  # committed tokens; the last one is pending
    detokenizer = IncrementalDetokenizer(target)
    stop_filter = StopStringFilter(stop)
    greedy = params.greedy
    learns = getattr(policy, "LEARNS", True)
    # The reply's token counts for presence/frequency penalties (None: both are 0).
    # Tokens join as they are committed, so row i of a verify sees the counts after
    # the accepted drafts before it, as a draft model drafting position i did.
    penalties = TokenCounts.for_penalties(params.presence_penalty, params.frequency_penalty)
    # A target with a recurrent state undoes at most this many drafts for free (its
    # snapshots); forced tokens and guesses together stay within it.
    most_drafts = rollback_limit(target)

    while True:
        if cancel is not None and cancel.is_set():
            yield _final_event(stats, stop_filter, detokenizer, FINISH_CANCELLED)
            return
        remaining = max_tokens - stats.generated_tokens
        room = target.n_ctx - len(target.cached_tokens) - 1
        if remaining <= 0 or room < 0:
            yield _final_event(stats, stop_filter, detokenizer, FINISH_LENGTH)
            return

        draft_room = min(remaining - 1, room)
        if most_drafts is not None:
            draft_room = min(draft_room, most_drafts)
        forced: list[int] = []
        if constraint is not None and draft_room > 0:
            # The grammar's only continuation: drafts that cost nothing to propose.
            forced = constraint.forced()[: min(draft_room, MAX_FORCED_DRAFTS)]
        plan, drafts, proposal = _round_drafts(
            policy,
            context,
            forced,
            draft_room,
            params,
            rng,
            constraint,
            penalties,
        )
        stats.runtime_seconds += proposal.runtime_seconds
        verify_started = time.perf_counter()

        base = len(target.cached_tokens)
        rows = forward_rows(target, [context[-1], *drafts])
        stats.runtime_seconds += time.perf_counter() - verify_started
        stats.target_passes += 1
        stats.draft_passes += proposal.passes

        emitted: list[int] = []
        from_draft: list[bool] = []
        # Aligned with ``emitted`` when logprobs are asked for. Each is read before
        # ``_advance``: the grammar's mask is the one in force before the token.
        emitted_logprobs: list[TokenLogprob] = []
        accepted = 0
        hit_end = False
        if greedy:
            # Only the argmax of each row, and only of rows up to the first mismatch.
            for position, draft_token in enumerate(drafts):
                if _greedy_under(rows, position, constraint, penalties) != draft_token:
                    break
                accepted += 1
                emitted.append(draft_token)
                from_draft.append(True)
                if logprobs is not None:
                    row = rows.row(position)
                    emitted_logprobs.append(
                        _raw_logprob(row, constraint, penalties, draft_token, logprobs)
                    )
                _advance(constraint, penalties, draft_token, target)
                if target.is_end_of_generation(draft_token):
                    hit_end = True
                    break
            if not hit_end:
                emitted.append(_greedy_under(rows, accepted, constraint, penalties))
                from_draft.append(False)
                if logprobs is not None:
                    row = rows.row(accepted)
                    emitted_logprobs.append(
                        _raw_logprob(row, constraint, penalties, emitted[-1], logprobs)
                    )
                _advance(constraint, penalties, emitted[-1], target)
        else:
            replacement: int | None = None
            p: SparseDistribution | None = None
            for position, draft_token in enumerate(drafts):
                p = _target_distribution(rows, position, params, constraint, penalties)
                q = _draft_distribution(proposal, position, draft_token)
                replacement = verify_draft_token(p, q, draft_token, rng)
                if replacement is not None:
                    break
                accepted += 1
                emitted.append(draft_token)
                from_draft.append(True)
                if logprobs is not None:
                    row = _penalised(rows.row(position), penalties)
                    emitted_logprobs.append(_sampled_logprob(p, row, draft_token, logprobs))
                _advance(constraint, penalties, draft_token, target)
                if target.is_end_of_generation(draft_token):
                    hit_end = True
                    break
            if not hit_end:
                if replacement is None:
                    p = _target_distribution(rows, accepted, params, constraint, penalties)
                    replacement = p.sample(rng)
                # Else p is still this position's distribution (the rejected draft's):
                # the token emitted here is distributed as p, whichever path chose it.
                emitted.append(replacement)
                from_draft.append(False)
                if logprobs is not None:
                    assert p is not None
                    row = _penalised(rows.row(accepted), penalties)
                    emitted_logprobs.append(_sampled_logprob(p, row, replacement, logprobs))
                _advance(constraint, penalties, replacement, target)

        # Keep the pending token and the accepted drafts; the new pending token (the
        # correction or bonus) is evaluated at the head of the next round.
        rollback_started = time.perf_counter()
        target.rollback(base + 1 + accepted)
        finished = time.perf_counter()
        stats.runtime_seconds += finished - rollback_started
        verify_seconds = finished - verify_started

        # The forced tokens lead the batch; the drafter's guesses follow them. Guesses
        # behind a forced token the target refused (a forced stretch that another
        # tokenisation could also spell) were never judged: not counted as drafted.
        guessed = len(drafts) - len(forced)
        judged = guessed if accepted >= len(forced) else 0
        guessed_accepted = max(0, accepted - len(forced))
        guesser = plan.drafter.name if plan.drafter is not None and guessed else "none"
        round_drafter = _round_drafter_name(bool(forced), guesser)
        stats.rounds += 1
        stats.grammar_forced += min(accepted, len(forced))
        if judged:
            stats.speculative_rounds += 1
            stats.drafted += judged
            stats.accepted += guessed_accepted
            stats.record_accepted_length(guessed_accepted)
        if learns:
            policy.observe(
                RoundOutcome(
                    drafter=guesser,
                    drafted=judged,
                    accepted=guessed_accepted,
                    verify_seconds=verify_seconds,
                    emitted=len(emitted),
                    draft_confidences=tuple(proposal.top_probs[:judged]),
                    draft_step_seconds=proposal.step_seconds,
                    other_verified=len(drafts) - judged,
                )
            )

        segments: list[TextSegment] = []
        finish: str | None = None
        kept_tokens: list[int] = []
        kept_provenance: list[bool] = []
        for token, drafted in zip(emitted, from_draft, strict=True):
            context.append(token)
            if target.is_end_of_generation(token):
                finish = FINISH_STOP
                break
            kept_tokens.append(token)
            kept_provenance.append(drafted)
            stats.generated_tokens += 1
            segments.append(TextSegment(detokenizer.push(token), drafted))
        now = time.perf_counter()
        if stats.time_to_first_token == 0.0 and (kept_tokens or finish):
            stats.time_to_first_token = now - started
        stats.decode_seconds = now - stats.decode_started
        if not drafts:
            stats.plain_rounds += 1
            stats.plain_round_seconds += now - previous_round_end
        previous_round_end = now
        if finish is None and stats.generated_tokens >= max_tokens:
            finish = FINISH_LENGTH
        if finish is not None:
            segments.append(TextSegment(detokenizer.flush(), False))

        shown, stopped = stop_filter.push(segments)
        if stopped:
            finish = FINISH_STOP
        elif finish is not None:
            shown.extend(stop_filter.flush())
        merged = _merge_segments(shown)
        yield GenerationEvent(
            text="".join(s.text for s in merged),
            segments=merged,
            tokens=tuple(kept_tokens),
            from_draft=tuple(kept_provenance),
            drafter=round_drafter,
            draft_length=len(drafts),
            stats=stats.snapshot(),
            finish_reason=finish,
            estimated_speedup=plan.estimated_speedup,
            decision=plan.reason,
            # The end-of-generation token is not in ``tokens``, so not here either.
            token_logprobs=tuple(emitted_logprobs[: len(kept_tokens)]),
            stop_sequence=stop_filter.matched if stopped else None,
        )
        if finish is not None:
            return


def _final_event(
    stats: _StatsAccumulator,
    stop_filter: StopStringFilter,
    detokenizer: IncrementalDetokenizer,
    finish_reason: str,
) -> GenerationEvent:
    tail, stopped = stop_filter.push([TextSegment(detokenizer.flush(), False)])
    if not stopped:
        tail.extend(stop_filter.flush())
    merged = _merge_segments(tail)
    return GenerationEvent(
        text="".join(s.text for s in merged),
        segments=merged,
        tokens=(),
        from_draft=(),
        drafter="none",
        draft_length=0,
        stats=stats.snapshot(),
        finish_reason=finish_reason,
    )


def _round_drafts(
    policy: DraftPolicy,
    context: list[int],
    forced: list[int],
    room: int,
    params: SamplingParams,
    rng: np.random.Generator,
    constraint: GrammarState | None,
    penalties: TokenCounts | None,
) -> tuple[RoundPlan, list[int], DraftProposal]:
    """This round's plan and drafts: the grammar's forced tokens, then the drafter's.

    The policy plans, and its drafter drafts, from the context after the forced
    tokens (the grammar state and the penalty counts are moved past them meanwhile,
    and back), so one verify checks both: the free stretch and the guesses after it.
    ``room`` bounds the whole batch of drafts. The proposal's distributions (q) are
    aligned with the drafts: a point mass for each forced token.
    """
    after = [*context, *forced] if forced else context
    if forced:
        assert constraint is not None
        constraint.consume(forced)
        if penalties is not None:
            penalties.add(forced)
    try:
        plan = policy.plan(after)
        length = max(0, min(plan.draft_length, room - len(forced)))
        proposal = EMPTY_PROPOSAL
        if plan.drafter is not None and length > 0:
            shaped = constraint is not None or penalties is not None
            if shaped and getattr(plan.drafter, "FOLLOWS_GRAMMAR", False):
                proposal = plan.drafter.propose(
                    after, length, params, rng, constraint=constraint, penalties=penalties
                )
            else:
                proposal = plan.drafter.propose(after, length, params, rng)
        guesses = proposal.tokens[:length]
        if constraint is not None and guesses:
            # A draft the grammar refuses would be rejected anyway; not verifying it
            # keeps the masks below defined.
            guesses = guesses[: constraint.valid_prefix(guesses)]
    finally:
        if forced:
            assert constraint is not None
            constraint.rollback(len(forced))
            if penalties is not None:
                penalties.remove(forced)
    if not forced:
        return plan, guesses, proposal
    distributions = None
    if proposal.distributions is not None:
        points = [SparseDistribution.point(token) for token in forced]
        distributions = points + proposal.distributions[: len(guesses)]
    combined = dataclasses.replace(
        proposal, tokens=[*forced, *guesses], distributions=distributions
    )
    return plan, [*forced, *guesses], combined


def _round_drafter_name(forced: bool, guesser: str) -> str:
    """What the round's event says drafted: "grammar", the drafter, or both."""
    if not forced:
        return guesser
    return "grammar" if guesser == "none" else f"grammar+{guesser}"


def _draft_distribution(proposal: DraftProposal, position: int, token: int) -> SparseDistribution:
    if proposal.distributions is not None and position < len(proposal.distributions):
        return proposal.distributions[position]
    return SparseDistribution.point(token)


# At most this many grammar-forced tokens are verified in one round (a long forced
# stretch, such as a schema's keys, continues in the next round).
MAX_FORCED_DRAFTS = 16


def _penalised(row: np.ndarray, penalties: TokenCounts | None) -> np.ndarray:
    """``row`` with the reply's presence/frequency penalties applied (as it is without)."""
    return row if penalties is None else penalties.apply(row)


def _masked(row: np.ndarray, constraint: GrammarState | None) -> np.ndarray:
    """``row`` with the tokens the grammar refuses here at -inf (as it is without one)."""
    if constraint is None:
        return row
    return mask_logits(row, constraint.allowed())


def _greedy_under(
    rows: LogitRows, index: int, constraint: GrammarState | None, penalties: TokenCounts | None
) -> int:
    """The argmax of the penalised row ``index`` among the tokens the grammar allows here.

    Without penalties the runtime answers the argmax itself (on its device, if it
    has one); the whole row is read only where the reply's penalties change it or the
    grammar refuses that argmax.
    """
    if penalties is None:
        token = rows.greedy(index)
        if constraint is None or constraint.allows(token):
            return token  # the unmasked argmax is allowed, so it is the masked one too
        return greedy_token(_masked(rows.row(index), constraint))
    row = _penalised(rows.row(index), penalties)
    token = greedy_token(row)
    if constraint is None or constraint.allows(token):
        return token
    return greedy_token(_masked(row, constraint))


def _target_distribution(
    rows: LogitRows,
    index: int,
    params: SamplingParams,
    constraint: GrammarState | None,
    penalties: TokenCounts | None,
) -> SparseDistribution:
    """p at row ``index``: the target's row, penalised and masked, then filtered.

    Without penalties or a grammar the runtime filters the row itself; plain and
    speculative decoding both come here, so they sample the same p.
    """
    if penalties is None and constraint is None:
        return rows.distribution(index, params)
    return distribution(_masked(_penalised(rows.row(index), penalties), constraint), params)


def _advance(
    constraint: GrammarState | None, penalties: TokenCounts | None, token: int, target: Model
) -> None:
    """Move the grammar and the penalty counts past an emitted token; an
    end-of-generation token ends the output instead (the grammar allowed it only where
    the output is complete)."""
    if target.is_end_of_generation(token):
        return
    if constraint is not None:
        constraint.consume([token])
    if penalties is not None:
        penalties.add([token])


def _raw_logprob(
    row: np.ndarray,
    constraint: GrammarState | None,
    penalties: TokenCounts | None,
    token: int,
    top_n: int,
) -> TokenLogprob:
    """``token``'s log-softmax in the (penalised, masked) raw row at temperature 1
    (greedy decoding), with exactly ``top_n`` alternatives."""
    penalised = _penalised(row, penalties)
    values = _masked(penalised, constraint)
    log_total = log_normaliser(values)
    logprob = float(values[token]) - log_total
    alternatives = [
        (int(index), float(values[index]) - log_total)
        for index in top_ids(values, top_n)
        if np.isfinite(values[index])  # a token the grammar refuses comes last, below
    ]
    return TokenLogprob(token, logprob, _filled(alternatives, penalised, top_n))


def _sampled_logprob(
    p: SparseDistribution, row: np.ndarray, token: int, top_n: int
) -> TokenLogprob:
    """``token``'s log-probability under ``p``, the distribution the loop sampled from,
    with exactly ``top_n`` alternatives (``row``: p's penalised, unmasked logits)."""
    probability = p.prob_of(token)
    logprob = float(np.log(probability)) if probability > 0.0 else -np.inf
    alternatives = [
        (int(p.ids[index]), float(np.log(p.probs[index])))
        for index in top_ids(p.probs, top_n)
        if p.probs[index] > 0.0
    ]
    return TokenLogprob(token, logprob, _filled(alternatives, row, top_n))


def _filled(
    alternatives: list[tuple[int, float]], row: np.ndarray, top_n: int
) -> tuple[tuple[int, float], ...]:
    """``alternatives`` padded to ``top_n`` entries, as OpenAI always lists N.

    Where the filters or the grammar left fewer possible tokens, the next likeliest
    tokens of ``row`` (the logits before those filters) follow at -inf: they could not
    be chosen here, and the API writes them as -9999.
    """
    wanted = min(top_n, row.shape[0])
    if len(alternatives) >= wanted:
        return tuple(alternatives)
    listed = {token for token, _ in alternatives}
    for index in top_ids(row, wanted + len(listed)):
        if len(alternatives) == wanted:
            break
        if int(index) not in listed:
            alternatives.append((int(index), -np.inf))
    return tuple(alternatives)
