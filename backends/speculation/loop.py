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
an adaptive one can measure costs and acceptance and choose per round. Under one that
asks for it (``auto``) the first round never drafts with a drafter that would first
have to read the prompt (a draft model's cache follows lazily, so it has not): its
token, the target's own from the prompt's last row, is streamed at once
(``FirstRound``).

Its parts live beside it: the policy's interface in ``draft_policy.py``, one round's
verification in ``verification.py``, events and stats in ``generation_events.py``,
where a reply ends on its text (stop strings, a repeated call) in ``reply_end.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from backends.base import (
    IncrementalDetokenizer,
    Model,
    SavePoint,
    reusable_prefix,
    rollback_limit,
)
from backends.errors import ContextOverflowError
from backends.generation_events import (
    FINISH_CANCELLED,
    FINISH_LENGTH,
    FINISH_STOP,
    MAX_TOP_LOGPROBS,
    GenerationEvent,
    StatsAccumulator,
    TextSegment,
    merge_segments,
)
from backends.output.constraints import GrammarState
from backends.output.repeated_calls import RepeatedCallStop
from backends.output.reply_end import ReplyEnd
from backends.sampling.filters import SamplingParams
from backends.sampling.penalties import TokenCounts
from backends.speculation.draft_policy import DraftPolicy, FirstRound, RoundOutcome
from backends.speculation.overlap import round_steps
from backends.speculation.verification import verify_round
from backends.token_prefix import common_prefix_length

# Prompt tokens read between two looks at ``cancel``.
PREFILL_SLICE = 1024


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
    prepare_cache: Callable[[Sequence[int]], SavePoint | None] | None = None,
    repeated_calls: RepeatedCallStop | None = None,
    overlap_drafting: bool = False,
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
    ``backends/caches/conversation_cache.py``; a prefix saved on disk,
    ``disk_prefixes.py``); its time counts as reading the prompt. It may return a
    :class:`SavePoint`: reading the prompt pauses there while the state is kept.

    Stops at an end-of-generation token, a stop string (which is not shown),
    ``max_tokens``, a full context, or when ``cancel`` is set (checked between
    rounds). Raises :class:`ContextOverflowError` if the prompt does not fit.

    With ``repeated_calls`` (a request that allows parallel tool calls) the reply also
    ends where a tool call identical to an earlier one begins; that call is not shown
    and the last event says ``repeated_call``.

    ``logprobs`` (None: off; N in 0..20) adds to each event a :class:`TokenLogprob`
    per token, with the N most likely alternatives. They are computed from the
    target's rows only when asked for, since they cost host time per token.

    ``overlap_drafting`` (a target split over workers, whose verify waits on the network)
    drafts the next round during each verify where that applies (see ``overlap.py``).
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
    stats = StatsAccumulator(prompt_tokens=len(prompt_tokens))
    started = time.perf_counter()
    save_point = prepare_cache(prompt_tokens) if prepare_cache is not None else None

    # Prefill everything but the last prompt token, without logits; that token is the
    # first round's "pending" token, evaluated together with the first drafts.
    cached = list(target.cached_tokens)
    reuse = min(common_prefix_length(cached, prompt_tokens), len(prompt_tokens) - 1)
    # A recurrent state cut back this far keeps less than the shared prefix; the rest
    # is read again (counted as read, not as reused).
    stats.cached_prompt_tokens = reusable_prefix(target, reuse)
    target.rollback(reuse)
    read_whole = _read_prompt(target, prompt_tokens, reuse, save_point, cancel)
    stats.prefill_seconds = time.perf_counter() - started
    stats.decode_started = time.perf_counter()
    previous_round_end = stats.decode_started
    detokenizer = IncrementalDetokenizer(target)
    reply_end = ReplyEnd(stop, repeated_calls)
    if not read_whole:
        # What was read stays cached: a retry of the same prompt starts from there.
        yield _final_event(stats, reply_end, detokenizer, FINISH_CANCELLED)
        return

    policy.begin(prompt_tokens)
    context = list(prompt_tokens)  # committed tokens; the last one is pending
    greedy = params.greedy
    learns = getattr(policy, "LEARNS", True)
    # The first round's plan: where the policy asks, never one that waits for a drafter
    # to read the prompt (the first token is the target's own, streamed at once).
    first_round = (
        FirstRound(policy, prompt_tokens)
        if getattr(policy, "FIRST_TOKEN_NEVER_WAITS", False)
        else policy
    )
    # The reply's token counts for presence/frequency penalties (None: both are 0).
    # Tokens join as they are committed, so row i of a verify sees the counts after
    # the accepted drafts before it, as a draft model drafting position i did.
    penalties = TokenCounts.for_penalties(params.presence_penalty, params.frequency_penalty)
    # A target with a recurrent state undoes at most this many drafts for free (its
    # snapshots); forced tokens and guesses together stay within it.
    most_drafts = rollback_limit(target)
    # Exact output: the largest batch that rounds like one-token decoding (None: any).
    exact_batch = getattr(policy, "exact_batch_limit", None)
    # With ``overlap_drafting``, the next round is drafted during the verify (overlap.py).
    draft_round, verify_forward = round_steps(
        overlap_drafting, params, constraint, penalties, stats
    )

    while True:
        if cancel is not None and cancel.is_set():
            yield _final_event(stats, reply_end, detokenizer, FINISH_CANCELLED)
            return
        remaining = max_tokens - stats.generated_tokens
        room = target.n_ctx - len(target.cached_tokens) - 1
        if remaining <= 0 or room < 0:
            yield _final_event(stats, reply_end, detokenizer, FINISH_LENGTH)
            return

        draft_room = min(remaining - 1, room)
        if most_drafts is not None:
            draft_room = min(draft_room, most_drafts)
        forced: list[int] = []
        if constraint is not None and draft_room > 0:
            # The grammar's only continuation: drafts that cost nothing to propose.
            forced = constraint.forced()[: min(draft_room, MAX_FORCED_DRAFTS)]
            if forced and exact_batch is not None:
                # A forced stretch and the guesses after it are verified in exact
                # batches too (the stretch goes on next round): computed in a larger
                # one, its cache would round otherwise than plain decoding's.
                draft_room = min(draft_room, exact_batch - 1)
                forced = forced[:draft_room]
        plan, drafts, proposal = draft_round(
            policy if stats.rounds else first_round,
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
        rows = verify_forward(target, [context[-1], *drafts])
        stats.runtime_seconds += time.perf_counter() - verify_started
        stats.target_passes += 1
        stats.draft_passes += proposal.passes

        emitted, from_draft, emitted_logprobs, accepted = verify_round(
            target,
            rows,
            drafts,
            proposal,
            params,
            rng,
            constraint,
            penalties,
            logprobs,
            greedy=greedy,
        )

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
        tail = TextSegment(detokenizer.flush(), False) if finish is not None else None
        end = reply_end.push(segments, tail, finish is not None)
        if end.stopped or end.repeated:
            finish = FINISH_STOP
            # Drafts accepted past the stop were never the reply's: plain decoding
            # would have ended at the token that completed it.
            stats.generated_tokens -= len(kept_tokens) - end.tokens
            del kept_tokens[end.tokens :], kept_provenance[end.tokens :]
        merged = merge_segments(end.shown)
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
            costs_note=plan.costs_note,
            # The end-of-generation token is not in ``tokens``, so not here either.
            token_logprobs=tuple(emitted_logprobs[: len(kept_tokens)]),
            stop_sequence=reply_end.matched if end.stopped else None,
            repeated_call=end.repeated,
        )
        if finish is not None:
            return


def _read_prompt(
    target: Model,
    prompt_tokens: Sequence[int],
    reuse: int,
    save_point: SavePoint | None,
    cancel: threading.Event | None,
) -> bool:
    """Read the prompt from ``reuse`` up to its last token, pausing at ``save_point``
    (when it lies ahead) so the state there can be kept; False if cancelled."""
    end = len(prompt_tokens) - 1
    if save_point is not None and reuse <= save_point.position <= end:
        if not _prefill(target, prompt_tokens[reuse : save_point.position], cancel):
            return False
        save_point.reached()
        reuse = save_point.position
    return _prefill(target, prompt_tokens[reuse:end], cancel)


def _prefill(target: Model, tokens: Sequence[int], cancel: threading.Event | None) -> bool:
    """Read ``tokens`` into the target's cache a slice at a time; False if ``cancel``
    was set before the last slice (the slices read so far stay cached).

    An agent's prompt takes minutes to read on a CPU, and its client may give up and
    go (or the server stop) meanwhile: the queue should not be held for a reader who
    has left. A slice spans several of the runtime's batches, so the checks cost nothing.
    The slices are of equal size (at most ``PREFILL_SLICE``), so the last one is never a
    stub: a recurrent target keeps its checkpoint where a prefill of a prompt-sized
    stretch ends (backends/llamacpp/rollback.py), and that must be the prompt's end.
    """
    if not tokens:
        return True
    slices = -(-len(tokens) // PREFILL_SLICE)
    size = -(-len(tokens) // slices)
    for offset in range(0, len(tokens), size):
        if cancel is not None and cancel.is_set():
            return False
        target.prefill(tokens[offset : offset + size])
    return True


def _final_event(
    stats: StatsAccumulator,
    reply_end: ReplyEnd,
    detokenizer: IncrementalDetokenizer,
    finish_reason: str,
) -> GenerationEvent:
    end = reply_end.finish(TextSegment(detokenizer.flush(), False))
    merged = merge_segments(end.shown)
    return GenerationEvent(
        text="".join(s.text for s in merged),
        segments=merged,
        tokens=(),
        from_draft=(),
        drafter="none",
        draft_length=0,
        stats=stats.snapshot(),
        finish_reason=FINISH_STOP if end.repeated else finish_reason,
        stop_sequence=reply_end.matched if end.stopped else None,
        repeated_call=end.repeated,
    )


def _round_drafter_name(forced: bool, guesser: str) -> str:
    """What the round's event says drafted: "grammar", the drafter, or both."""
    if not forced:
        return guesser
    return "grammar" if guesser == "none" else f"grammar+{guesser}"


# At most this many grammar-forced tokens are verified in one round (a long forced
# stretch, such as a schema's keys, continues in the next round).
MAX_FORCED_DRAFTS = 16
