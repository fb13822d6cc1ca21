"""Drafting with an EAGLE-3 head: a one-block decoder trained beside the target, which
reads the inputs of three of the target's layers at every position and drafts a chain.

The runtime runs the head and keeps it in step with the target's cache (llama.cpp's
in backends/llamacpp/eagle3.py); to the loop it is a :class:`DraftHead` like the MTP
head: it catches up with what the target accepted, reads the pending token, and
chains on its own hidden state. So this drafter samples and shapes its rows exactly as
:class:`~backends.speculation.mtp_drafter.MtpDrafter` does the MTP head's: its ``q`` is
the head's own filtered distribution (the loop's acceptance is exact rejection
sampling), rows are masked under a grammar and penalised like the target's, and a
chain stops where the head's confidence falls below its floor. Only its name differs,
which keeps its acceptance and costs apart from the MTP head's where both exist.
"""

from __future__ import annotations

from backends.base import Model
from backends.speculation.mtp_drafter import DraftHead, MtpDrafter

# What a target without a head is told (after its name) when asked to draft with one.
NO_EAGLE3_HEAD = (
    "has no EAGLE-3 head loaded. Give the head's GGUF with --target TARGET --draft HEAD, "
    "or pick a pair whose drafter is eagle3."
)


class Eagle3Drafter(MtpDrafter):
    """Drafts a chain from the target's EAGLE-3 head (see the module's docstring)."""

    name = "eagle3"

    def __init__(
        self,
        target: Model,
        head: DraftHead,
        min_confidence: float = 0.0,
        *,
        record_confidence: bool = False,
    ) -> None:
        super().__init__(target, head, min_confidence, record_confidence=record_confidence)

    def with_confidence_floor(self) -> Eagle3Drafter:
        """A drafter over the same head whose floor its owner sets (and that records)."""
        return Eagle3Drafter(self.target, self.head, self.min_confidence, record_confidence=True)
