"""Where a reply ends on its own text: stop strings, then a repeated tool call.

The loop emits several tokens a round under speculation, but a reply must end where
plain decoding would end it: at the first token after which a stop string (or a
repeated call) is found. :class:`ReplyEnd` therefore reads a round token by token, as
one-token rounds would arrive, and says how many of the round's tokens the reply keeps:
the rest (accepted drafts past the stop) are neither shown nor counted as generated, so
``usage`` is the same with and without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.generation_events import TextSegment
from backends.output.repeated_calls import RepeatedCallStop
from backends.output.stop_strings import StopStringFilter


@dataclass
class RoundEnd:
    """What one round's text comes to after the stop strings and the repeat check."""

    shown: list[TextSegment] = field(default_factory=list)
    # How many of the round's tokens the reply keeps (all, unless it ended inside).
    tokens: int = 0
    stopped: bool = False  # a stop string matched
    repeated: bool = False  # a repeated tool call began


class ReplyEnd:
    """The stop strings and the repeated-call stop, fed as plain decoding would feed them."""

    def __init__(self, stop: Sequence[str], repeated_calls: RepeatedCallStop | None) -> None:
        self._stop = StopStringFilter(stop)
        self._repeats = repeated_calls
        # Neither can end the reply: text passes whole, without the per-token walk.
        self._passes = not self._stop.stop and repeated_calls is None

    @property
    def matched(self) -> str | None:
        """The stop string that ended the reply, if one did."""
        return self._stop.matched

    def push(
        self, token_texts: Sequence[TextSegment], tail: TextSegment | None, last: bool
    ) -> RoundEnd:
        """Read a round: one segment per kept token, then the detokenizer's ``tail``
        (its held bytes, at the reply's end); ``last`` when the round ends the reply.

        Each token's text goes through the filters alone, so the reply stops at the
        same token as one-token rounds would, with the same stop string found first.
        """
        if self._passes:
            shown = [*token_texts, tail] if tail is not None else list(token_texts)
            return RoundEnd(shown, len(token_texts))
        pieces = [[segment] for segment in token_texts]
        if tail is not None:
            if pieces:
                pieces[-1].append(tail)
            else:
                pieces.append([tail])
        result = RoundEnd()
        for index, piece in enumerate(pieces):
            final = last and index == len(pieces) - 1
            shown, stopped = self._stop.push(piece)
            if not stopped and final:
                shown.extend(self._stop.flush())
            repeated = False
            if self._repeats is not None:
                shown, repeated = self._through_repeats(shown, stopped or final)
            result.shown.extend(shown)
            if stopped or repeated:
                result.stopped, result.repeated = stopped, repeated
                result.tokens = min(index + 1, len(token_texts))
                return result
        result.tokens = len(token_texts)
        return result

    def finish(self, tail: TextSegment) -> RoundEnd:
        """The reply ends without a round (cancelled, out of room): release what is held."""
        return self.push((), tail, True)

    def _through_repeats(
        self, shown: list[TextSegment], last: bool
    ) -> tuple[list[TextSegment], bool]:
        """``shown`` less what may begin a repeated call (all of it when ``last``)."""
        assert self._repeats is not None
        kept, repeated = self._repeats.push(shown)
        if last and not repeated:
            kept.extend(self._repeats.flush())
        return kept, repeated
