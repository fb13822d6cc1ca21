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
from backends.output.reply_end import ReplyEnd
from backends.sampling.penalties import TokenCounts
from backends.speculation.draft_policy import DraftPolicy, FirstRound, RoundOutcome
from backends.speculation.overlap import round_steps
from backends.speculation.reply_spec import NO_HOOKS, LoopHooks, ReplySpec
from backends.speculation.round_sampling import RoundSampling
from backends.speculation.tree_round import round_tree, tree_rows
from backends.speculation.verification import VerifiedRound, verify_round, verify_tree
from backends.token_prefix import common_prefix_length

# Prompt tokens read between two looks at ``cancel``.
PREFILL_SLICE = 1024


def speculative_generate(
    target: Model,
    prompt_tokens: Sequence[int],
    policy: DraftPolicy,
    reply: ReplySpec,
    hooks: LoopHooks = NO_HOOKS,
) -> Iterator[GenerationEvent]:
    """Generate ``reply`` from ``prompt_tokens``, yielding one event per round; the
    ``policy`` picks each round's drafter and K.

    With a grammar (``reply.constraint``) every row of the target and of the draft
    model is masked by the grammar's state after the tokens before it, the same mask for
    p and q, so the output is distributed exactly as constrained plain decoding. Where
    the grammar allows one continuation only, those tokens are this round's drafts
    ("grammar"): free, and accepted by construction.

    The target's cache is reused where it already holds a prefix of the prompt (a
    chat's earlier turns); ``hooks.prepare_cache`` may first put a better starting state
    into the caches (a kept conversation, ``backends/caches/conversation_cache.py``; a
    prefix saved on disk, ``disk_prefixes.py``); its time counts as reading the prompt.

    Stops at an end-of-generation token, a stop string, a repeated tool call (the last
    event says ``repeated_call``), ``max_tokens``, a full context, or when
    ``hooks.cancel`` is set. Raises :class:`ContextOverflowError` if the prompt does not
    fit. Log-probabilities are computed from the target's rows only when asked for,
    since they cost host time per token.
    """
    if reply.logprobs is not None and not 0 <= reply.logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs must be in 0..{MAX_TOP_LOGPROBS} (or None for none)")
    if not prompt_tokens:
        raise ValueError("the prompt is empty")
    if len(prompt_tokens) >= target.n_ctx:
        raise ContextOverflowError(
            f"The prompt is {len(prompt_tokens)} tokens but the context holds "
            f"{target.n_ctx}. Shorten the prompt or start with a larger --context."
        )
    stats = StatsAccumulator(prompt_tokens=len(prompt_tokens))
    started = time.perf_counter()
    read_whole = _read_prompt(target, prompt_tokens, stats, hooks.prepare_cache, hooks.cancel)
    stats.prefill_seconds = time.perf_counter() - started
    stats.decode_started = stats.round_ended = time.perf_counter()
    detokenizer = IncrementalDetokenizer(target)
    reply_end = ReplyEnd(reply.stop, reply.repeated_calls)
    if not read_whole:
        # What was read stays cached: a retry of the same prompt starts from there.
        yield _final_event(stats, reply_end, detokenizer, FINISH_CANCELLED)
        return

    policy.begin(prompt_tokens)
    context = list(prompt_tokens)  # committed tokens; the last one is pending
    # The first round's plan: where the policy asks, never one that waits for a drafter
    # to read the prompt (the first token is the target's own, streamed at once).
    first_round = FirstRound(policy, prompt_tokens) if policy.FIRST_TOKEN_NEVER_WAITS else policy
    # The reply's token counts for presence/frequency penalties (None: both are 0).
    # Tokens join as they are committed, so row i of a verify sees the counts after
    # the accepted drafts before it, as a draft model drafting position i did.
    params, constraint = reply.params, reply.constraint
    penalties = TokenCounts.for_penalties(params.presence_penalty, params.frequency_penalty)
    sampling = RoundSampling(params, np.random.default_rng(params.seed), constraint, penalties)
    # A target with a recurrent state undoes at most this many drafts for free (its
    # snapshots); forced tokens and guesses together stay within it.
    most_drafts = rollback_limit(target)
    # With ``overlap_drafting``, the next round is drafted during the verify (overlap.py).
    draft_round, verify_forward = round_steps(hooks.overlap_drafting, sampling, stats)

    while True:
        if hooks.cancel is not None and hooks.cancel.is_set():
            yield _final_event(stats, reply_end, detokenizer, FINISH_CANCELLED)
            return
        remaining = reply.max_tokens - stats.generated_tokens
        room = target.n_ctx - len(target.cached_tokens) - 1
        if remaining <= 0 or room < 0:
            yield _final_event(stats, reply_end, detokenizer, FINISH_LENGTH)
            return
        draft_room = min(remaining - 1, room, most_drafts if most_drafts is not None else room)
        forced, draft_room = _forced_tokens(constraint, draft_room, policy.exact_batch_limit)
        round_policy = policy if stats.rounds else first_round
        plan, drafts, proposal = draft_round(round_policy, context, forced, draft_room, sampling)
        stats.runtime_seconds += proposal.runtime_seconds
        stats.draft_passes += proposal.passes

        # Other likely continuations verified in the same batch, where that is cheap
        # (under exact output, within the batches that round like one-token decoding).
        tree = round_tree(
            target, plan, drafts, forced, proposal, sampling, policy.exact_batch_limit
        )

        verify_started = time.perf_counter()
        base = len(target.cached_tokens)
        if tree is None:
            rows = verify_forward(target, [context[-1], *drafts])
            judging_started = time.perf_counter()
            verified = verify_round(target, rows, drafts, proposal, sampling, reply.logprobs)
            # Keep the pending token and the accepted drafts; the new pending token (the
            # correction or bonus) is evaluated at the head of the next round.
            rollback_started = time.perf_counter()
            target.rollback(base + 1 + verified.accepted)
        else:
            rows = tree_rows(target, context[-1], tree)
            judging_started = time.perf_counter()
            verified = verify_tree(target, rows, tree, sampling, reply.logprobs)
            # The same, along the accepted path: the other branches' nodes are dropped.
            rollback_started = time.perf_counter()
            target.keep_tree_path(verified.path)  # type: ignore[attr-defined]
            stats.count_tree(verified.path, len(drafts))
        finished = time.perf_counter()
        verify_seconds = finished - verify_started
        # The judging (sampling, logprobs) is host work between the runtime's calls.
        stats.runtime_seconds += verify_seconds - (rollback_started - judging_started)

        judged, guesses_accepted = stats.count_verify(len(drafts), len(forced), verified.accepted)
        guessed = len(drafts) > len(forced)
        guesser = plan.drafter.name if plan.drafter is not None and guessed else "none"
        if policy.LEARNS:
            policy.observe(
                RoundOutcome(
                    drafter=guesser,
                    drafted=judged,
                    accepted=guesses_accepted,
                    verify_seconds=verify_seconds,
                    emitted=len(verified.emitted),
                    draft_confidences=tuple(proposal.top_probs[:judged]),
                    draft_step_seconds=proposal.step_seconds,
                    other_verified=(tree.size if tree else len(drafts)) - judged,
                )
            )

        kept, provenance, segments, finish = _commit(
            target, verified, context, detokenizer, stats, reply.max_tokens
        )
        stats.count_round_end(
            time.perf_counter(), started, wrote=bool(kept or finish), plain=not drafts
        )
        tail = TextSegment(detokenizer.flush(), False) if finish is not None else None
        end = reply_end.push(segments, tail, finish is not None)
        if end.stopped or end.repeated:
            finish = FINISH_STOP
            # Drafts accepted past the stop were never the reply's: plain decoding
            # would have ended at the token that completed it.
            stats.generated_tokens -= len(kept) - end.tokens
            del kept[end.tokens :], provenance[end.tokens :]
        merged = merge_segments(end.shown)
        yield GenerationEvent(
            text="".join(s.text for s in merged),
            segments=merged,
            tokens=tuple(kept),
            from_draft=tuple(provenance),
            drafter=_round_drafter_name(bool(forced), guesser),
            draft_length=len(drafts),
            stats=stats.snapshot(),
            finish_reason=finish,
            estimated_speedup=plan.estimated_speedup,
            decision=plan.reason,
            costs_note=plan.costs_note,
            # The end-of-generation token is not in ``tokens``, so not here either.
            token_logprobs=tuple(verified.logprobs[: len(kept)]),
            stop_sequence=reply_end.matched if end.stopped else None,
            repeated_call=end.repeated,
        )
        if finish is not None:
            return


def _forced_tokens(
    constraint: GrammarState | None, draft_room: int, exact_batch: int | None
) -> tuple[list[int], int]:
    """The grammar's only continuation, as drafts that cost nothing to propose, and the
    round's room for drafts after it is bounded for them."""
    if constraint is None or draft_room <= 0:
        return [], draft_room
    forced = constraint.forced()[: min(draft_room, MAX_FORCED_DRAFTS)]
    if forced and exact_batch is not None:
        # A forced stretch and the guesses after it are verified in exact batches too
        # (the stretch goes on next round): computed in a larger one, its cache would
        # round otherwise than plain decoding's.
        draft_room = min(draft_room, exact_batch - 1)
        forced = forced[:draft_room]
    return forced, draft_room


def _commit(
    target: Model,
    verified: VerifiedRound,
    context: list[int],
    detokenizer: IncrementalDetokenizer,
    stats: StatsAccumulator,
    max_tokens: int,
) -> tuple[list[int], list[bool], list[TextSegment], str | None]:
    """Commit the round's tokens to ``context`` up to an end-of-generation token: the
    tokens kept for the reply, whether each came from a draft, their text, and how the
    reply finished (None: it goes on)."""
    segments: list[TextSegment] = []
    finish: str | None = None
    kept: list[int] = []
    provenance: list[bool] = []
    for token, drafted in zip(verified.emitted, verified.from_draft, strict=True):
        context.append(token)
        if target.is_end_of_generation(token):
            finish = FINISH_STOP
            break
        kept.append(token)
        provenance.append(drafted)
        stats.generated_tokens += 1
        segments.append(TextSegment(detokenizer.push(token), drafted))
    if finish is None and stats.generated_tokens >= max_tokens:
        finish = FINISH_LENGTH
    return kept, provenance, segments, finish


def _read_prompt(
    target: Model,
    prompt_tokens: Sequence[int],
    stats: StatsAccumulator,
    prepare_cache: Callable[[Sequence[int]], SavePoint | None] | None,
    cancel: threading.Event | None,
) -> bool:
    """Read all of the prompt but its last token (the first round's pending one, read
    with the first drafts) into the target's cache, reusing what it holds of it;
    False if cancelled.

    ``prepare_cache`` runs first; a :class:`SavePoint` it returns has reading pause
    there (when it lies ahead) so the state there can be kept.
    """
    save_point = prepare_cache(prompt_tokens) if prepare_cache is not None else None
    end = len(prompt_tokens) - 1
    reuse = min(common_prefix_length(list(target.cached_tokens), prompt_tokens), end)
    # A recurrent state cut back this far keeps less than the shared prefix; the rest
    # is read again (counted as read, not as reused).
    stats.cached_prompt_tokens = reusable_prefix(target, reuse)
    target.rollback(reuse)
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
