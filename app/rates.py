"""A rate over a sliding window of cumulative counts: tokens/sec, bytes/sec.

The chat's stats bar and the download progress both want "how fast over the last second
or so", not the spike of the latest chunk; this is the one place that computes it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RollingRate:
    """Count per second over a sliding window of the moments the count changed.

    Only changes are kept: a caller may record the same count many times (the chat's
    timer ticks between two rounds of the loop), and a round slower than the window
    must not read as a stop. The rate is the count gained from the oldest kept change
    to the newest, over that span; once the wait since the newest change is longer than
    the span, over that wait instead, so a real stall decays towards 0 rather than
    holding the last burst's figure.
    """

    def __init__(
        self, window_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_seconds = window_seconds
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def reset(self) -> None:
        """Forget all samples (a new reply or download starts)."""
        self._samples.clear()

    def add(self, total: int) -> None:
        """Record the cumulative count now (reads the clock once); a count equal to the
        last one recorded changes nothing."""
        if self._samples and self._samples[-1][1] == total:
            return
        now = self._clock()
        self._samples.append((now, total))
        # Keep the last two changes however old, and one change older than the window,
        # so the rate spans a whole window (or a whole round, when rounds are slower).
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_seconds:
            self._samples.popleft()

    def span(self) -> tuple[float, int]:
        """Seconds from the oldest to the newest kept change, and the count gained in them."""
        if not self._samples:
            return 0.0, 0
        (first_time, first_count), (last_time, last_count) = self._samples[0], self._samples[-1]
        return last_time - first_time, last_count - first_count

    def rate(self) -> float:
        """Count/sec over the kept changes, or over the wait since the last one when
        that is longer (so it decays when counts stop)."""
        seconds, gained = self.span()
        if gained == 0:
            return 0.0
        waited = self._clock() - self._samples[-1][0]
        elapsed = max(seconds, waited)
        return gained / elapsed if elapsed > 0 else 0.0
