"""Stop strings: text that may begin one is held back; a full match cuts the output.

Also :func:`partial_suffix`, how much of a text's end may begin a marker, which the
tool-call parser holds back for the same reason, and the cutting of segments that the
repeated-call stop (``repeated_calls.py``) shares.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from backends.generation_events import TextSegment


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
            shown = take_chars(self._held, cut)
            self._held = []
            return shown, True
        safe = len(held_text) - partial_suffix(held_text, self.stop)
        shown = take_chars(self._held, safe)
        self._held = drop_chars(self._held, safe)
        return shown, False

    def flush(self) -> list[TextSegment]:
        """Release held text at the end of generation (no stop string followed)."""
        held, self._held = self._held, []
        return held


def _earliest_match(text: str, stops: Sequence[str]) -> int | None:
    positions = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(positions) if positions else None


def partial_suffix(text: str, markers: Collection[str]) -> int:
    """The length of the longest end of ``text`` that begins some marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def take_chars(segments: Sequence[TextSegment], count: int) -> list[TextSegment]:
    """The first ``count`` characters of ``segments``, provenance kept."""
    taken: list[TextSegment] = []
    for segment in segments:
        if count <= 0:
            break
        part = segment.text[:count]
        taken.append(TextSegment(part, segment.from_draft))
        count -= len(part)
    return taken


def drop_chars(segments: Sequence[TextSegment], count: int) -> list[TextSegment]:
    """``segments`` without their first ``count`` characters."""
    kept: list[TextSegment] = []
    for segment in segments:
        if count >= len(segment.text):
            count -= len(segment.text)
            continue
        kept.append(TextSegment(segment.text[count:], segment.from_draft))
        count = 0
    return kept
