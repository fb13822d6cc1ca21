"""The n-gram drafter's acceptance, learned while it sits out.

While the controller decodes plainly, the n-gram drafter is *shadowed*: each plain
round asks it what it would propose, and once plain decoding has written the tokens
that decide it, the proposal is scored as if it had been drafted. That costs nothing
(lookups take microseconds, and the target never verifies a shadow), so when the text
turns repetitive the controller (backends/speculation/controller.py) learns it within
a few tokens and drafts again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from backends.speculation.acceptance import AcceptanceEstimate
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.proposal import Drafter
from backends.token_prefix import common_prefix_length


class NgramShadow:
    """The n-gram proposals made in plain rounds, each waiting for the tokens that decide it."""

    def __init__(self) -> None:
        # (where the proposal starts in the context, its tokens, its acceptance key)
        self._shadows: list[tuple[int, list[int], str]] = []

    def reset(self) -> None:
        """A new generation: forget the proposals of the last one."""
        self._shadows = []

    def start(self, ngram: Drafter | None, context: Sequence[int], max_tokens: int) -> None:
        """Ask the n-gram drafter what it would propose; score it as plain decoding writes.

        A new shadow starts every plain round (lookups cost microseconds), so a
        repetitive stretch is noticed within a few tokens.
        """
        if not isinstance(ngram, NgramDrafter):
            return
        tokens, size = ngram.lookup(context, max_tokens)
        if tokens and size >= ngram.min_match:
            key = ngram.last_match_key
            self._shadows.append((len(context), list(tokens), key))

    def score(self, context: Sequence[int], estimate: Callable[[str], AcceptanceEstimate]) -> None:
        """Score every shadow proposal whose outcome the written tokens now decide, into
        ``estimate(key)`` (the acceptance estimate of the match it came from)."""
        pending: list[tuple[int, list[int], str]] = []
        for start, proposed, key in self._shadows:
            written = context[start : start + len(proposed)]
            matched = common_prefix_length(proposed, written)
            if matched == len(written) and len(written) < len(proposed):
                pending.append((start, proposed, key))  # agrees so far; not decided yet
                continue
            estimate(key).observe(min(len(proposed), matched + 1), matched)
        self._shadows = pending
