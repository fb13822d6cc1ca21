"""Rolling back an MLX prompt cache whose recurrent layers cannot be trimmed.

Hybrid models (Qwen3.5/3.6, mlx-lm's ``qwen3_5``, ``qwen3_5_moe``, ``qwen3_next``) keep
a Gated DeltaNet layer's state in mlx-lm's ``ArraysCache``: a convolution window and a
fixed-size recurrent state into which every token has been folded. mlx-lm cannot trim
it (``is_trimmable()`` is False), but it never changes an array in place either: each
forward *replaces* the cache's entries (``cache[0] = ...``, ``cache[1] = state``), and
MLX arrays are immutable. So keeping references to a layer's arrays at a position is
a snapshot that costs nothing (no copy; the old arrays stay alive, about 150 MB for
Qwen3.6-27B's 48 DeltaNet layers).

A rollback to ``n_keep`` puts back the nearest snapshot at or before it, trims the
attention layers' ``KVCache`` to that snapshot's position as usual, and the model then
*replays* the tokens between (a forward whose output layer is never evaluated).
Snapshots are kept where a rollback will come back to:

- before a forward of several tokens with logits (a verify: its rejected drafts are
  undone next, and its accepted ones replayed),
- after a prefill of a prompt-sized stretch (the next turn of a chat returns there),
- where a caller says a rollback will return (``keep_rollback_point``: a draft model
  before it drafts a chain of one-token steps, which it will partly undo).

The empty state (position 0) is always a snapshot, so any rollback is correct; one
that no other snapshot reaches reads everything again.

Nothing here imports ``mlx``: backends/mlx/model.py passes in mlx-lm's cache
classes, and runs the replays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backends.errors import DecodeError

# A prefill at least this long reads a prompt (or a turn of one): keep a snapshot
# after it. Shorter ones are replays and catch-ups.
ANCHOR_MIN_TOKENS = 8
# The deepest rollback the controller is told it may ask for right after a verify:
# the longest draft it sends anyway (backends/speculation/controller.py DEFAULT_MAX_DRAFT). Any
# depth is served by the snapshot before the verify; what grows with the draft is the
# replay of its accepted part.
ROLLBACK_LIMIT = 16


def untrimmable_cache_reason(cache: Sequence[Any], *, sliding: type, recurrent: type) -> str | None:
    """Why this prompt cache cannot be rolled back, or None when it can.

    A ``sliding`` layer (mlx-lm's ``RotatingKVCache``) reports itself trimmable only
    until its window fills, after which the positions a rollback needs are gone.
    ``recurrent`` layers (``ArraysCache``: Gated DeltaNet, Mamba) never trim, but
    snapshots restore them.
    """
    windows = [layer for layer in cache if isinstance(layer, sliding)]
    if windows:
        return f"{len(windows)} of its {len(cache)} layers use a sliding-window cache"
    kinds = {
        type(layer).__name__
        for layer in cache
        if not (layer.is_trimmable() or isinstance(layer, recurrent))
    }
    if kinds:
        return f"its cache layers of type {', '.join(sorted(kinds))} cannot be trimmed"
    return None


def cache_rollback(cache: Sequence[Any], *, recurrent: type) -> TrimRollback:
    """What rolls this prompt cache back: snapshots where it has ``recurrent`` layers."""
    if any(isinstance(layer, recurrent) for layer in cache):
        return RecurrentSnapshots(cache, recurrent)
    return TrimRollback(cache)


def cache_nbytes(cache: Sequence[Any], *, recurrent: type) -> int:
    """Bytes held by a prompt cache: key and value buffers, and ``recurrent`` layers'
    arrays (mlx-lm's ``ArraysCache`` has no ``nbytes``; entries not yet written are None)."""
    return sum(
        sum(int(array.nbytes) for array in layer.cache if array is not None)
        if isinstance(layer, recurrent)
        else int(layer.nbytes)
        for layer in cache
    )


@dataclass(frozen=True, eq=False)
class _Snapshot:
    """The recurrent layers' arrays after the first ``position`` tokens (references)."""

    position: int
    states: tuple[tuple[Any, ...], ...]


class TrimRollback:
    """The rollback of a prompt cache whose every layer can be trimmed (a KV cache):
    any suffix is dropped, nothing needs to be kept or replayed."""

    recurrent = False
    rollback_limit: int | None = None

    def __init__(self, cache: Sequence[Any]) -> None:
        self.attach(cache)

    def attach(self, cache: Sequence[Any]) -> None:
        """Work on ``cache`` (a new or restored one)."""
        self._attention = list(cache)

    def before_forward(self, position: int, count: int) -> None:
        """A forward of ``count`` tokens with logits starts at ``position``."""

    def prefilled(self, position: int, count: int) -> None:
        """A prefill of ``count`` tokens ended at ``position``."""

    def keep_point(self, position: int) -> None:
        """A later rollback will return to ``position`` (the cache's current end)."""

    def rollback(self, tokens: list[int], n_keep: int) -> list[int]:
        """Drop the cached positions of ``tokens`` from ``n_keep`` on (cutting ``tokens``);
        return the tokens the model must evaluate again to reach ``n_keep``: none."""
        self._trim(len(tokens) - n_keep)
        del tokens[n_keep:]
        return []

    def reusable_prefix(self, held: int, shared: int) -> int:
        """How many of the first ``shared`` of ``held`` tokens a rollback to ``shared``
        keeps without evaluating them again."""
        return min(held, shared)

    def _trim(self, excess: int) -> None:
        for layer in self._attention:
            trimmed = layer.trim(excess)
            if trimmed != excess:
                raise DecodeError(f"mlx-lm trimmed {trimmed} of {excess} cached positions")


class RecurrentSnapshots(TrimRollback):
    """The rollback of a prompt cache with recurrent layers, by snapshot and replay.

    Works on the cache's layers as mlx-lm makes them, without importing mlx: a
    recurrent layer's arrays are the list ``layer.cache``; every other layer has
    ``trim(n)``. The model does the replays.
    """

    recurrent = True
    rollback_limit = ROLLBACK_LIMIT

    def __init__(self, cache: Sequence[Any], recurrent_type: type) -> None:
        self._recurrent_type = recurrent_type
        super().__init__(cache)
        # For tests and measurements: snapshots restored, tokens to evaluate again.
        self.restores = 0
        self.replayed_tokens = 0

    def attach(self, cache: Sequence[Any]) -> None:
        """Work on ``cache`` (a new or restored one), forgetting every snapshot."""
        self._recurrent = [layer for layer in cache if isinstance(layer, self._recurrent_type)]
        self._attention = [layer for layer in cache if layer not in self._recurrent]
        empty = tuple(tuple(None for _ in layer.cache) for layer in self._recurrent)
        self._origin = _Snapshot(0, empty)
        self._anchor: _Snapshot | None = None  # after the last prompt prefill
        self._round: _Snapshot | None = None  # where the current round may return

    # -- keeping points --------------------------------------------------------

    def before_forward(self, position: int, count: int) -> None:
        """A forward of ``count`` tokens with logits starts at ``position``: if it can be
        partly undone (more than one token), keep the state before it."""
        if count > 1:
            self.keep_point(position)

    def prefilled(self, position: int, count: int) -> None:
        """A prefill of ``count`` tokens ended at ``position``: keep it if it read a prompt."""
        if count >= ANCHOR_MIN_TOKENS and not self._has_point(position):
            self._anchor = self._snapshot(position)

    def keep_point(self, position: int) -> None:
        """A later rollback will return to ``position`` (the cache's current end)."""
        if not self._has_point(position):
            self._round = self._snapshot(position)

    # -- rolling back ------------------------------------------------------------

    def rollback(self, tokens: list[int], n_keep: int) -> list[int]:
        """Put the cache, which holds ``tokens``, back to the nearest snapshot at or before
        ``n_keep``; cut ``tokens`` there and return the ones the model must evaluate
        again to reach ``n_keep``."""
        self._forget_points_after(n_keep)
        point = self._nearest(n_keep)
        for layer, state in zip(self._recurrent, point.states, strict=True):
            layer.cache = list(state)
        self._trim(len(tokens) - point.position)
        replay = tokens[point.position : n_keep]
        del tokens[point.position :]
        self.restores += 1
        self.replayed_tokens += len(replay)
        return replay

    def reusable_prefix(self, held: int, shared: int) -> int:
        """How many of the first ``shared`` of ``held`` tokens a rollback to ``shared``
        keeps without evaluating them again: what the nearest snapshot holds."""
        return held if shared >= held else self._nearest(shared).position

    # -- internals -------------------------------------------------------------------

    def _points(self) -> list[_Snapshot]:
        return [p for p in (self._origin, self._anchor, self._round) if p is not None]

    def _nearest(self, position: int) -> _Snapshot:
        return max((p for p in self._points() if p.position <= position), key=lambda p: p.position)

    def _has_point(self, position: int) -> bool:
        return any(p.position == position for p in self._points())

    def _forget_points_after(self, position: int) -> None:
        if self._anchor is not None and self._anchor.position > position:
            self._anchor = None
        if self._round is not None and self._round.position > position:
            self._round = None

    def _snapshot(self, position: int) -> _Snapshot:
        # References, not copies: the next forward replaces these arrays, never
        # changes them (and MLX does not donate a buffer that is still referenced).
        return _Snapshot(position, tuple(tuple(layer.cache) for layer in self._recurrent))
