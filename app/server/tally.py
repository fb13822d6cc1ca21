"""What a generation has produced so far: its text, logprobs, statistics and prediction counts."""

from __future__ import annotations

from typing import Any

from backends.speculative import GenerationEvent, TokenLogprob


class GenerationTally:
    """What a generation has produced so far, read by the response formats."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        # Every generated token's logprob (empty unless the request asked for them).
        self.logprobs: list[TokenLogprob] = []
        self.last: GenerationEvent | None = None
        self.decision = ""
        self.prediction_drafted = 0
        self.prediction_accepted = 0
        self._drafted = 0
        self._accepted = 0

    def add(self, event: GenerationEvent) -> None:
        """Count one event; draft work is attributed to the drafter of its round."""
        drafted = event.stats.drafted - self._drafted
        accepted = event.stats.accepted - self._accepted
        self._drafted, self._accepted = event.stats.drafted, event.stats.accepted
        if event.drafter == "prediction":
            self.prediction_drafted += drafted
            self.prediction_accepted += accepted
        self.pieces.append(event.text)
        self.logprobs.extend(event.token_logprobs)
        self.last = event
        self.decision = event.decision or self.decision

    @property
    def text(self) -> str:
        """The whole answer so far."""
        return "".join(self.pieces)

    @property
    def finish_reason(self) -> str | None:
        """The finish reason ("stop", "length", "cancelled") once the generation ended."""
        return self.last.finish_reason if self.last else None

    def draftpen(self) -> dict[str, Any]:
        """The ``draftpen`` field: running statistics plus the latest drafter choice."""
        if self.last is None:
            return {}
        return {
            **self.last.stats.as_dict(),
            "drafter": self.last.drafter,
            "draft_length": self.last.draft_length,
            "estimated_speedup": round(self.last.estimated_speedup, 3),
            "decision": self.decision,
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
                "reasoning_tokens": 0,
                "accepted_prediction_tokens": self.prediction_accepted,
                "rejected_prediction_tokens": self.prediction_drafted - self.prediction_accepted,
            },
        }
