"""Holding the stored cost curve to what the loop measures, so `auto` is never slower.

`auto` decides with a curve measured once and stored (calibration.py,
app/calibration_store.py). A curve taken while the machine was busy can be wrong by
several times; seen: a one-token forward stored at 295 ms where it costs 45 ms, so
plain decoding looked dear, `auto` drafted at 0.69x of plain for good and, drafting,
never timed a one-token forward again to find out. Three rules keep the premise true:

- **A forward faster than its figure says the figure is wrong.** Noise (a stall, another
  process) only ever slows a forward down, so two measurements in a row under the
  figure by :data:`DISAGREE_FACTOR` replace it at once.
- **A forward slower than its figure needs a majority.** One stalled step is not a
  cost: the figure moves only when the median of the last :data:`SLOW_SAMPLES`
  measurements is over it by the factor (a machine that became busy).
- **The one-token cost is checked while `auto` drafts.** Plain rounds are the only ones
  that time it. Every :data:`PLAIN_CHECK_INTERVAL` drafting rounds one round is plain,
  and at once when a measured verify of several tokens costs less than the stored
  one-token figure (impossible unless that figure is too high), or when a one-token
  forward came in under its figure: then plain rounds follow until the rules above
  have decided (at most :data:`MOST_CONFIRMING_ROUNDS`).

When the one-token figure is replaced, the whole curve is suspect: the sizes measured
since take their measurements, and the others are scaled by the ratio of measured to
stored at the nearest measured sizes (interpolated between two, the largest's beyond
it), no cheaper than one token; a scaled figure is a guess, and the first measurement
that disagrees with it by the factor replaces it. Each
correction is described in words (:attr:`CostAudit.corrections`) for the user and
handed to ``on_correction`` (the app stores the corrected curve; nothing waits for it).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DISAGREE_FACTOR = 1.5
FAST_SAMPLES = 2
SLOW_SAMPLES = 3
PLAIN_CHECK_INTERVAL = 48  # drafting rounds between two timed one-token forwards
# A verify of n tokens measured under the one-token figure by this much contradicts it.
CONTRADICTION_FACTOR = 1.25
# Plain rounds at most, in a row, to settle a disagreement about the one-token cost.
MOST_CONFIRMING_ROUNDS = 3
# How the front ends introduce a correction's words (CostCorrection.describe).
COSTS_NOTE_PREFIX = "auto re-measured its stored figures: "


@dataclass(frozen=True)
class CostCorrection:
    """One figure the loop replaced: what it was, what was measured, in words."""

    key: int | str  # a batch size, "draft" for the draft model's step, or a head's name
    stored_seconds: float
    measured_seconds: float

    def describe(self) -> str:
        """E.g. "one-token forward 46 ms measured, 295 ms stored"."""
        what = {1: "one-token forward", "draft": "draft-model step", "mtp": "MTP-head step"}
        if isinstance(self.key, str):
            name = what.get(self.key, f"{self.key} head step")
        else:
            name = what.get(self.key, f"{self.key}-token forward")
        return (
            f"{name} {_milliseconds(self.measured_seconds)} ms measured, "
            f"{_milliseconds(self.stored_seconds)} ms stored"
        )


def _milliseconds(seconds: float) -> str:
    """295, 45, 8.3, 0.35: three significant digits at most, no exponent."""
    milliseconds = seconds * 1000
    return f"{milliseconds:.0f}" if milliseconds >= 100 else f"{milliseconds:.3g}"


class CostAudit:
    """Watches measured forwards against the figures they refine; says what to replace."""

    def __init__(self, on_correction: Callable[[CostCorrection], None] | None = None) -> None:
        self._recent: dict[int | str, deque[float]] = {}
        self.corrections: list[CostCorrection] = []
        self.on_correction = on_correction
        self._rounds_since_plain = 0
        self._confirming = 0
        # Figures scaled, not measured, when the one-token figure was replaced: the first
        # measurement that disagrees with one replaces it.
        self._guessed: set[int | str] = set()

    def check(self, key: int | str, figure: float | None, seconds: float) -> float | None:
        """Count a measurement of ``key`` against its ``figure``; the value that should
        replace the figure outright (None: keep refining it as usual)."""
        # Runs every round: the common case (the figure holds) is an append and two
        # comparisons. Each rule can only newly hold when the latest measurement agrees
        # with it, so the rules are read only then.
        recent = self._recent.get(key)
        if recent is None:
            recent = self._recent[key] = deque(maxlen=SLOW_SAMPLES)
        recent.append(seconds)
        if figure is None or figure <= 0:
            return None
        fast = seconds * DISAGREE_FACTOR < figure
        slow = seconds > figure * DISAGREE_FACTOR
        if not (fast or slow):
            if self._guessed:
                self._guessed.discard(key)
            return None
        if self._guessed and key in self._guessed:
            self._guessed.discard(key)
            replacement = seconds
        elif fast and len(recent) >= FAST_SAMPLES and recent[-2] * DISAGREE_FACTOR < figure:
            replacement = max(recent[-1], recent[-2])  # the slower: never too optimistic
        elif slow and len(recent) == SLOW_SAMPLES and sorted(recent)[1] > figure * DISAGREE_FACTOR:
            replacement = sorted(recent)[1]
        else:
            if key == 1 and fast:
                # One more plain round decides. (A one-token forward slower than its
                # figure asks for none: plain decoding then costs more than `auto`
                # thinks, so drafting pays more than it expects, never less.)
                self._confirming = MOST_CONFIRMING_ROUNDS
            return None
        recent.clear()
        if key == 1:
            self._confirming = 0
        self.corrections.append(CostCorrection(key, figure, replacement))
        return replacement

    def announce(self) -> None:
        """Hand the latest correction to ``on_correction``, once the figures show it."""
        if self.on_correction is not None and self.corrections:
            self.on_correction(self.corrections[-1])

    def guessed(self, keys: set[int | str]) -> None:
        """These figures were scaled, not measured: trust the first measurement."""
        self._guessed = set(keys)

    def measured(self, key: int | str) -> float | None:
        """The median of ``key``'s recent measurements since load or its last
        replacement (None: none)."""
        recent = self._recent.get(key)
        return statistics.median(recent) if recent else None

    def verified(self, batch: int, seconds: float, one_token_figure: float) -> None:
        """A round verified ``batch`` tokens: count it toward the next plain check."""
        if batch == 1:
            self._rounds_since_plain = 0
            return
        self._rounds_since_plain += 1
        if seconds * CONTRADICTION_FACTOR < one_token_figure and not self._confirming:
            # n tokens cannot cost less than one: the one-token figure is too high.
            self._confirming = MOST_CONFIRMING_ROUNDS

    def take_plain_check(self) -> bool:
        """Should a round that would draft be plain instead, to time a one-token forward?
        True counts it as done (a grammar may still put forced tokens in its batch)."""
        if not (self._confirming > 0 or self._rounds_since_plain >= PLAIN_CHECK_INTERVAL):
            return False
        self._confirming = max(0, self._confirming - 1)
        self._rounds_since_plain = 0
        return True

    def since(self, count: int) -> str:
        """What was corrected after the first ``count`` corrections, in words ("" when
        nothing was): the one-token figure's first correction where there is one (what
        was stored against what was measured: every decision is weighed against it),
        else the first of any."""
        recent = self.corrections[count:]
        if not recent:
            return ""
        one_token = [correction for correction in recent if correction.key == 1]
        return (one_token or recent)[0].describe()
