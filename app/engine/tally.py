"""What a generation has produced so far: its text, logprobs, statistics and prediction counts.

For a model that reasons aloud, the tally splits each event's text into reasoning and
answer (:mod:`backends.output.reasoning`): ``pieces`` and ``text`` are the answer only, which is
all that tool-call parsing and ``content`` ever see.
"""

from __future__ import annotations

from typing import Any

from backends.generation_events import GenerationEvent, TokenLogprob
from backends.output.reasoning import ReasoningFormat, ReasoningSplit, ReasoningSplitter

# The drafters whose rounds drafted a caller's prediction (OpenAI counts those tokens):
# "grammar+prediction" drafted it after grammar-forced tokens, which are counted apart
# (grammar_forced), not as drafted.
PREDICTION_DRAFTERS = ("prediction", "grammar+prediction")


class GenerationTally:
    """What a generation has produced so far, read by the response formats."""

    def __init__(
        self, reasoning: ReasoningFormat | None = None, *, left_out_messages: int = 0
    ) -> None:
        # How many of the oldest messages were left out of the prompt to fit the context.
        self.left_out_messages = left_out_messages
        # The answer's text, one piece per event (reasoning left out).
        self.pieces: list[str] = []
        self.reasoning_pieces: list[str] = []
        self.reasoning_tokens = 0
        # What the latest event added, split (all answer for a model that does not think).
        self.latest = ReasoningSplit()
        self._splitter = ReasoningSplitter(reasoning) if reasoning is not None else None
        # Every generated token's logprob (empty unless the request asked for them).
        self.logprobs: list[TokenLogprob] = []
        self.last: GenerationEvent | None = None
        self.decision = ""
        self.costs_note = ""  # auto's figures corrected during this reply, in words
        # Draft tokens each drafter proposed and had accepted, over the whole reply: the
        # last event's drafter is only the last round's (often "none" at the end).
        self.drafted_by: dict[str, list[int]] = {}
        self._drafted = 0
        self._accepted = 0

    def add(self, event: GenerationEvent) -> None:
        """Count one event; draft work is attributed to the drafter of its round."""
        drafted = event.stats.drafted - self._drafted
        accepted = event.stats.accepted - self._accepted
        self._drafted, self._accepted = event.stats.drafted, event.stats.accepted
        if drafted:
            counts = self.drafted_by.setdefault(event.drafter, [0, 0])
            counts[0] += drafted
            counts[1] += accepted
        self.latest = self._split(event)
        self.pieces.append(self.latest.answer_text)
        self.reasoning_pieces.append(self.latest.reasoning_text)
        self.reasoning_tokens += self.latest.reasoning_tokens
        self.logprobs.extend(event.token_logprobs)
        self.last = event
        self.decision = event.decision or self.decision
        self.costs_note = event.costs_note or self.costs_note

    def _split(self, event: GenerationEvent) -> ReasoningSplit:
        if self._splitter is None:
            return ReasoningSplit(answer=event.segments, answer_tokens=len(event.tokens))
        split = self._splitter.feed(event.segments, len(event.tokens))
        if event.finish_reason is not None:
            split = split + self._splitter.finish()
        return split

    @property
    def text(self) -> str:
        """The whole answer so far (without the reasoning)."""
        return "".join(self.pieces)

    @property
    def reasoning_text(self) -> str:
        """The reasoning so far (empty for a model that does not think)."""
        return "".join(self.reasoning_pieces)

    @property
    def finish_reason(self) -> str | None:
        """The finish reason ("stop", "length", "cancelled") once the generation ended."""
        return self.last.finish_reason if self.last else None

    @property
    def prediction_drafted(self) -> int:
        """Draft tokens a caller's prediction proposed, over the reply so far."""
        return sum(self.drafted_by.get(name, [0, 0])[0] for name in PREDICTION_DRAFTERS)

    @property
    def prediction_accepted(self) -> int:
        """Of :attr:`prediction_drafted`, those the target accepted."""
        return sum(self.drafted_by.get(name, [0, 0])[1] for name in PREDICTION_DRAFTERS)

    def draftpen(self) -> dict[str, Any]:
        """The ``draftpen`` field: running statistics plus the latest drafter choice."""
        if self.last is None:
            return {}
        fitted = {"left_out_messages": self.left_out_messages} if self.left_out_messages else {}
        # The reply ended where it began to repeat a tool call (backends/output/repeated_calls.py).
        repeated = {"stopped_at_repeated_call": True} if self.last.repeated_call else {}
        return {
            **fitted,
            **repeated,
            **self.last.stats.as_dict(),
            "drafter": self.last.drafter,
            # {drafter: {"drafted": n, "accepted": m}} over the reply so far.
            "drafted_by": {
                name: {"drafted": drafted, "accepted": accepted}
                for name, (drafted, accepted) in self.drafted_by.items()
            },
            "draft_length": self.last.draft_length,
            "estimated_speedup": round(self.last.estimated_speedup, 3),
            "decision": self.decision,
            **({"costs_note": self.costs_note} if self.costs_note else {}),
            # Of generated_tokens, those a thinking model spent reasoning (so far).
            "reasoning_tokens": self.reasoning_tokens,
        }

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage block; prediction tokens count as OpenAI counts them."""
        stats = self.last.stats if self.last else None
        prompt = stats.prompt_tokens if stats else 0
        completion = stats.generated_tokens if stats else 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens if stats else 0},
            "completion_tokens_details": {
                "reasoning_tokens": self.reasoning_tokens,
                "accepted_prediction_tokens": self.prediction_accepted,
                "rejected_prediction_tokens": self.prediction_drafted - self.prediction_accepted,
            },
        }
