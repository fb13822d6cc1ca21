"""What the chat screen tracks about a reply while it is written (no UI, no decoding).

:class:`ReplyFigures` is the one summary of a reply that the stats bar and the
message footer show and that the history stores, taken from the loop's own statistics.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from backends.generation_events import GenerationEvent, TextSegment


@dataclass(frozen=True)
class ReplyFigures:
    """A reply's speculation figures, straight from the loop's statistics."""

    generated_tokens: int
    decode_tokens_per_second: float
    acceptance_rate: float
    mean_accepted_length: float
    drafted: int
    accepted: int
    drafter: str
    draft_length: int
    estimated_speedup: float
    finish_reason: str | None = None
    # The loop's own time per token (outside the runtime's forward calls); 0 in
    # figures saved before it was measured.
    host_ms_per_token: float = 0.0
    # Tokens a thinking model spent reasoning (part of generated_tokens).
    reasoning_tokens: int = 0
    # `auto`'s stored figures corrected during this reply, in words ("" when not).
    costs_note: str = ""

    @classmethod
    def from_event(cls, event: GenerationEvent, reasoning_tokens: int = 0) -> ReplyFigures:
        """The figures as of ``event`` (the loop's snapshot, not recomputed)."""
        stats = event.stats
        return cls(
            generated_tokens=stats.generated_tokens,
            decode_tokens_per_second=stats.decode_tokens_per_second,
            acceptance_rate=stats.acceptance_rate,
            mean_accepted_length=stats.mean_accepted_length,
            drafted=stats.drafted,
            accepted=stats.accepted,
            drafter=event.drafter or "none",
            draft_length=event.draft_length,
            estimated_speedup=event.estimated_speedup,
            finish_reason=event.finish_reason,
            host_ms_per_token=stats.host_ms_per_token,
            reasoning_tokens=reasoning_tokens,
            costs_note=event.costs_note,
        )

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> ReplyFigures | None:
        """Figures saved by :meth:`as_dict`; None when the record is unusable.

        Fields added since a record was saved take their defaults.
        """
        known = {name: values[name] for name in cls.__dataclass_fields__ if name in values}
        try:
            return cls(**known)  # type: ignore[arg-type]
        except TypeError:
            return None

    def as_dict(self) -> dict[str, object]:
        """Plain data for the history database."""
        return asdict(self)

    def summary(self) -> str:
        """The final figures, as shown under a finished reply and in the stats bar."""
        return (
            f"{self.generated_tokens} tokens"
            + (f" ({self.reasoning_tokens} reasoning)" if self.reasoning_tokens else "")
            + f" · {self.decode_tokens_per_second:.1f} tok/s · "
            f"accepted {self.accepted}/{self.drafted} ({self.acceptance_rate:.0%}) · "
            f"mean accepted length {self.mean_accepted_length:.2f}"
            + (f" · host {self.host_ms_per_token:.2f} ms/token" if self.host_ms_per_token else "")
        )


def merge_segments(
    segments: list[tuple[str, bool]], new: tuple[TextSegment, ...]
) -> list[tuple[str, bool]]:
    """Append ``new`` to ``segments``, joining neighbours of the same provenance."""
    for segment in new:
        if not segment.text:
            continue
        if segments and segments[-1][1] == segment.from_draft:
            segments[-1] = (segments[-1][0] + segment.text, segment.from_draft)
        else:
            segments.append((segment.text, segment.from_draft))
    return segments
