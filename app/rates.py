"""A rate over a sliding window of cumulative counts: tokens/sec, bytes/sec.

The chat's stats bar and the download progress both want "how fast over the last second
or so", not the spike of the latest chunk; this is the one place that computes it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RollingRate:
    """Count per second over a sliding window of (time, cumulative count) samples."""

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
        """Record the cumulative count now (reads the clock once)."""
        now = self._clock()
        self._samples.append((now, total))
        # Keep one sample older than the window, so the rate spans a whole window.
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_seconds:
            self._samples.popleft()

    def span(self) -> tuple[float, int]:
        """Seconds from the oldest to the newest sample, and the count gained in them."""
        if not self._samples:
            return 0.0, 0
        (first_time, first_count), (last_time, last_count) = self._samples[0], self._samples[-1]
        return last_time - first_time, last_count - first_count

    def rate(self) -> float:
        """Count/sec over the window, measured up to now (so it decays when counts stop)."""
        if len(self._samples) < 2:
            return 0.0
        first_time, first_count = self._samples[0]
        elapsed = self._clock() - first_time
        return (self._samples[-1][1] - first_count) / elapsed if elapsed > 0 else 0.0
