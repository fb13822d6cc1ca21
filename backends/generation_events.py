"""What a generation yields: one event per round, with its text, provenance and stats.

The loop (``backends/speculation/loop.py``) builds these; the TUI, the engine, the client
and bench read them. Also the running totals behind :class:`SpeculativeStats`, whose
decode time less the runtimes' own is the loop's host cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

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
    # Drafting during a split target's verify (backends/speculation/overlap.py): rounds
    # whose next round was drafted meanwhile, for the likeliest outcome, and how many
    # of those drafts were used (the guess held: every draft and the bonus as guessed).
    predrafted_rounds: int = 0
    predrafts_used: int = 0
    # Rounds that verified several continuations as one tree (draft_tree.py), and those
    # whose accepted path left the best one for another.
    tree_rounds: int = 0
    other_branch_rounds: int = 0

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
        """Plain data for JSON output: every field (seconds rounded), then the derived
        rates. The fields are read from the class, so a new one is never left out."""
        data: dict[str, object] = {}
        for name in _STATS_FIELDS:
            value = getattr(self, name)
            if isinstance(value, float):
                value = round(value, 6 if name == "host_seconds" else 4)
            elif isinstance(value, tuple):
                value = list(value)
            data[name] = value
        for name, digits in _DERIVED_RATES.items():
            data[name] = round(getattr(self, name), digits)
        return data


# The rates as_dict adds to the fields, and the digits each is rounded to.
_DERIVED_RATES = {
    "acceptance_rate": 4,
    "mean_accepted_length": 4,
    "tokens_per_target_pass": 4,
    "decode_tokens_per_second": 3,
    "host_ms_per_token": 4,
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
    # `auto`'s figures corrected during this reply, in words ("" when none were): the
    # stats bar says so (backends/speculation/cost_audit.py).
    costs_note: str = ""
    # One per token in ``tokens`` when the generation asked for logprobs; else empty.
    token_logprobs: tuple[TokenLogprob, ...] = ()
    # The stop string that ended the generation (finish_reason "stop"); None when an
    # end-of-generation token, a limit or a cancel ended it, or it goes on.
    stop_sequence: str | None = None
    # The generation ended where a tool call identical to an earlier one of the reply
    # began (finish_reason "stop"; the repeat is not in ``text``): see repeated_calls.py.
    repeated_call: bool = False


@dataclass
class StatsAccumulator:
    """The loop's running totals, mutable; :meth:`snapshot` freezes them for an event."""

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
    predrafted_rounds: int = 0
    predrafts_used: int = 0
    tree_rounds: int = 0
    other_branch_rounds: int = 0
    round_ended: float = 0.0  # when the last round's event was made (or decoding began)

    def count_tree(self, path: Sequence[int], best_length: int) -> None:
        """Count a round that verified a tree of continuations; ``path`` is the nodes it
        accepted, and the best continuation is its first ``best_length`` nodes."""
        self.tree_rounds += 1
        if any(node >= best_length for node in path):
            self.other_branch_rounds += 1

    def record_accepted_length(self, accepted: int) -> None:
        while len(self.histogram) <= accepted:
            self.histogram.append(0)
        self.histogram[accepted] += 1

    def count_verify(self, verified: int, forced: int, accepted: int) -> tuple[int, int]:
        """Count a round whose one verify judged ``verified`` drafts, the grammar's
        ``forced`` tokens leading, of which the target ``accepted`` the first ones;
        return the drafter's guesses judged and accepted.

        Guesses behind a forced token the target refused (a forced stretch another
        tokenisation could also spell) were never judged: not counted as drafted.
        """
        judged = verified - forced if accepted >= forced else 0
        guesses_accepted = max(0, accepted - forced)
        self.rounds += 1
        self.target_passes += 1
        self.grammar_forced += min(accepted, forced)
        if judged:
            self.speculative_rounds += 1
            self.drafted += judged
            self.accepted += guesses_accepted
            self.record_accepted_length(guesses_accepted)
        return judged, guesses_accepted

    def count_round_end(self, now: float, started: float, *, wrote: bool, plain: bool) -> None:
        """A round's tokens are out at ``now`` (the reply ``started`` then): the first
        token's time once something was written, decode time, plain rounds' time."""
        if self.time_to_first_token == 0.0 and wrote:
            self.time_to_first_token = now - started
        self.decode_seconds = now - self.decode_started
        if plain:
            self.plain_rounds += 1
            self.plain_round_seconds += now - self.round_ended
        self.round_ended = now

    def snapshot(self) -> SpeculativeStats:
        """The totals so far, frozen (the fields both classes have are copied by name)."""
        return SpeculativeStats(
            **{name: getattr(self, name) for name in _COPIED_FIELDS},
            accepted_length_histogram=tuple(self.histogram),
            host_seconds=max(0.0, self.decode_seconds - self.runtime_seconds),
        )


_STATS_FIELDS = tuple(stat.name for stat in fields(SpeculativeStats))
# What snapshot() copies by name: all but the two the accumulator keeps otherwise.
_COPIED_FIELDS = tuple(
    name for name in _STATS_FIELDS if name not in ("accepted_length_histogram", "host_seconds")
)


def merge_segments(segments: Sequence[TextSegment]) -> tuple[TextSegment, ...]:
    """``segments`` without empty ones, neighbours of the same provenance joined."""
    merged: list[TextSegment] = []
    for segment in segments:
        if not segment.text:
            continue
        if merged and merged[-1].from_draft == segment.from_draft:
            merged[-1] = TextSegment(merged[-1].text + segment.text, segment.from_draft)
        else:
            merged.append(segment)
    return tuple(merged)
