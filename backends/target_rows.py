"""The target's rows that a draft head has not read yet, kept beside the tokens they
belong to: what every runtime's heads (llama.cpp's, MLX's) keep between the target's
decodes and the head's own.

A head reads, for each position the target evaluated, a row of the target's (a hidden
state, or the inputs or outputs of some of its layers). Rows arrive a decode at a time
and a head reads them a batch at a time; a rollback of the target cuts them back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class TargetRows:
    """The target's tokens and rows for positions ``[start, end)``, kept until a head's
    cache has read them (a prompt's rows are read a batch at a time).

    Rows are numpy arrays by default; a runtime whose rows stay on its device gives its
    own empty array and ``concatenate`` (MLX's). ``keep_behind`` rows before the position
    :meth:`drop_before` is given are kept too: a head whose entry reads the row before
    its position rebuilds an entry a rollback dropped from them (a new turn of a chat
    cuts back a few positions), where without them it would start afresh.
    """

    def __init__(
        self,
        width: int,
        *,
        empty: Any = None,
        concatenate: Callable[[Sequence[Any]], Any] = np.concatenate,
        keep_behind: int = 0,
    ) -> None:
        self.keep_behind = keep_behind
        self.start = 0
        self.tokens: list[int] = []
        self.rows = np.empty((0, width), dtype=np.float32) if empty is None else empty
        self._concatenate = concatenate

    @property
    def end(self) -> int:
        """The position after the last row kept."""
        return self.start + len(self.tokens)

    def holds(self, position: int) -> bool:
        """Whether the row of ``position`` is kept."""
        return self.start <= position < self.end

    def add(self, start: int, tokens: Sequence[int], rows: Any) -> None:
        """The target evaluated ``tokens`` from ``start``; ``rows`` are theirs (numpy's
        are copied).

        Rows that do not continue the kept ones (a cache restored whole) replace them.
        """
        if start < self.start or start > self.end:
            self.start, self.tokens = start, []
            self.rows = self.rows[:0]
        kept = start - self.start
        self.tokens = [*self.tokens[:kept], *tokens]
        self.rows = self._concatenate([self.rows[:kept], rows])

    def cut(self, n_keep: int) -> None:
        """The target forgot positions from ``n_keep`` on."""
        if self.end > n_keep:
            kept = max(0, n_keep - self.start)
            self.tokens = self.tokens[:kept]
            self.rows = self.rows[:kept]

    def drop_before(self, position: int) -> None:
        """Rows before ``position`` are no longer needed (but ``keep_behind`` of them)."""
        drop = max(0, position - self.keep_behind - self.start)
        if drop:
            self.start += drop
            self.tokens = self.tokens[drop:]
            self.rows = self.rows[drop:]

    def forget(self) -> None:
        """Drop every row (the target's cache was replaced)."""
        self.start, self.tokens = 0, []
        self.rows = self.rows[:0]

    def between(self, first: int, stop: int) -> Any:
        """The rows of positions ``[first, stop)`` (all kept)."""
        return self.rows[first - self.start : stop - self.start]
