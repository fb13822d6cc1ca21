"""Rolling back a llama.cpp sequence whose memory holds a recurrent state.

Hybrid models (Qwen3.5/3.6 ``qwen35``/``qwen35moe``, ``qwen3next``, Nemotron-H, LFM2,
...) keep a fixed-size recurrent state (Gated DeltaNet, Mamba) beside, or instead of,
a KV cache. A KV cache forgets positions by dropping cells; a recurrent state has
folded every token into one tensor and cannot be cut back. llama.cpp offers two ways
back, and this module uses both, with a third as the floor:

1. **Snapshots** (``n_rs_seq`` in the context parameters, for the architectures that
   support it): every decode also writes the states after each of its last
   ``n_rs_seq + 1`` tokens, so ``llama_memory_seq_rm`` can drop up to ``n_rs_seq``
   positions *of the last decode*, once. That is exactly a verify batch's rejected
   drafts, at no cost. It does not reach further: dropping the last token of a
   one-token decode (a draft model's step) would need the state before that decode,
   which no snapshot holds, and llama.cpp accepts the call and silently continues
   from a stale state (measured on a tiny qwen35: logits off by 14). So the depth a
   snapshot serves is tracked here and never exceeded.
2. **Checkpoint and replay**: a copy of the recurrent part of the state
   (``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: kilobytes for a tiny model, ~150 MB for a
   27B one) is taken where a later rollback may return. A rollback past the
   snapshots restores the closest checkpoint at or before its target, cuts the KV
   cache there, and the tokens between are *replayed*: put in front of the next
   decode, so they cost a few more rows in a batch that runs anyway, not a pass.
3. **Reading again**: with no checkpoint before the target, the sequence is cleared
   and everything up to the target is replayed (a prompt read again; correct, slow).

Checkpoints are taken (a) after every prefill of a prompt-sized stretch (so that a
later prompt sharing it, such as the next turn of a chat, comes back to it), (b)
before a forward whose rollback the snapshots cannot cover (every verify on an
architecture without snapshots), and (c) where a caller says a rollback will come
back to the current position (``keep_rollback_point``: a draft model before it
drafts a chain of single tokens, which it will partly undo next round).

This module and ``backends/llamacpp/model.py`` are the only ones that import ``llama_cpp``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

# Snapshots asked for by default: the longest draft the adaptive controller sends
# (backends/speculation/controller.py DEFAULT_MAX_DRAFT), so its rollbacks never need a replay.
DEFAULT_SNAPSHOTS = 16
# A prefill at least this long reads a prompt (or a turn of one): keep a checkpoint
# after it. Shorter ones are replays and catch-ups, which need none.
ANCHOR_MIN_TOKENS = 8


def holds_recurrent_state(model: Any) -> bool:
    """Whether a loaded llama.cpp model keeps a recurrent state (alone or hybrid)."""
    return bool(llama_cpp.llama_model_is_recurrent(model)) or bool(
        llama_cpp.llama_model_is_hybrid(model)
    )


def granted_snapshots(context: Any) -> int:
    """The snapshots llama.cpp gave a context: 0 where the architecture has none."""
    return int(llama_cpp.llama_n_rs_seq(context))


@dataclass(frozen=True, eq=False)
class _Checkpoint:
    """The recurrent part of the state after the first ``position`` tokens."""

    position: int
    payload: np.ndarray


class RecurrentRollback:
    """The rollback bookkeeping of one recurrent llama.cpp sequence (sequence 0).

    The model keeps the *logical* token list (what ``cached_tokens`` says); this keeps
    ``physical``, how many of those llama.cpp's memory holds: the tokens between are
    waiting to be replayed in front of the next decode.
    """

    def __init__(self, context: Any, memory: Any, *, name: str) -> None:
        self._context = context
        self._memory = memory
        self.name = name
        self.snapshots = granted_snapshots(context)
        self.physical = 0
        self._last_decode = 0  # tokens in the last decode, 0 once a rollback used it
        self._anchor: _Checkpoint | None = None  # after the last prompt prefill
        self._round: _Checkpoint | None = None  # where the current round may return
        # For tests and measurements: tokens decoded again, checkpoints restored.
        self.replayed_tokens = 0
        self.restores = 0

    # -- decoding --------------------------------------------------------------

    def replay(self, tokens: Sequence[int]) -> list[int]:
        """The logical tokens llama.cpp does not hold yet (they lead the next decode)."""
        return list(tokens[self.physical :])

    def needs_checkpoint(self, count: int, with_logits: bool) -> bool:
        """Whether a decode of ``count`` tokens is a forward the snapshots could not undo.

        A forward (a verify) may have all but its first token rejected; snapshots serve
        that only up to ``snapshots`` tokens. A prefill (no logits) is never undone soon.
        """
        return with_logits and count - 1 > self.snapshots

    def before_decode(self, count: int, with_logits: bool) -> None:
        """Keep a checkpoint before a forward the snapshots could not roll back."""
        if self.needs_checkpoint(count, with_logits) and not self._has_point(self.physical):
            self._round = self._checkpoint()

    def decoded(self, count: int, replayed: int) -> None:
        """A decode of ``count`` tokens, ``replayed`` of them replays, went through."""
        self.physical += count
        self._last_decode = count
        self.replayed_tokens += replayed

    def prefilled(self, count: int) -> None:
        """A prefill of ``count`` tokens ended here: keep it if it read a prompt."""
        if count >= ANCHOR_MIN_TOKENS and not self._has_point(self.physical):
            self._anchor = self._checkpoint()

    def keep_point(self) -> None:
        """A later rollback will return here: keep a checkpoint (the caller flushed
        the replay first, so llama.cpp holds every logical token)."""
        if not self._has_point(self.physical):
            self._round = self._checkpoint()

    # -- rolling back ------------------------------------------------------------

    def rollback(self, n_keep: int) -> None:
        """Forget logical positions from ``n_keep`` on.

        Afterwards llama.cpp holds ``physical <= n_keep`` tokens and the rest up to
        ``n_keep`` wait to be replayed.
        """
        if n_keep >= self.physical:
            return  # the cut falls inside the replay: nothing held is dropped
        depth = self.physical - n_keep
        snapshot_serves = 0 < depth < self._last_decode and depth <= self.snapshots
        if snapshot_serves and llama_cpp.llama_memory_seq_rm(self._memory, 0, n_keep, -1):
            self.physical = n_keep
            self._last_decode = 0  # llama.cpp's snapshot rollback is single-use
            self._forget_points_after(n_keep)
            return
        self._forget_points_after(n_keep)
        point = max(
            (p for p in (self._anchor, self._round) if p is not None and p.position <= n_keep),
            key=lambda p: p.position,
            default=None,
        )
        if point is not None and self._restore(point):
            return
        self._clear()

    def reset(self, physical: int) -> None:
        """The whole state was replaced (restored, or cleared): start over at ``physical``."""
        self.physical = physical
        self._last_decode = 0
        self._anchor = self._round = None

    def reusable_prefix(self, shared: int) -> int:
        """How many of the first ``shared`` logical tokens a rollback to ``shared`` keeps
        in llama.cpp's memory (the rest up to ``shared`` would be decoded again)."""
        if shared >= self.physical:
            return self.physical
        depth = self.physical - shared
        if depth < self._last_decode and depth <= self.snapshots:
            return shared
        return max(
            (p.position for p in (self._anchor, self._round) if p and p.position <= shared),
            default=0,
        )

    # -- internals -----------------------------------------------------------------

    def _has_point(self, position: int) -> bool:
        return any(p is not None and p.position == position for p in (self._anchor, self._round))

    def _forget_points_after(self, position: int) -> None:
        if self._anchor is not None and self._anchor.position > position:
            self._anchor = None
        if self._round is not None and self._round.position > position:
            self._round = None

    def _checkpoint(self) -> _Checkpoint:
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(llama_cpp.llama_state_seq_get_size_ext(self._context, 0, flags))
        buffer = np.empty(size, dtype=np.uint8)
        written = llama_cpp.llama_state_seq_get_data_ext(
            self._context, _uint8_pointer(buffer), size, 0, flags
        )
        if written != size:
            raise RuntimeError(f"llama.cpp copied {written} of {size} bytes of {self.name}'s state")
        return _Checkpoint(self.physical, buffer)

    def _restore(self, point: _Checkpoint) -> bool:
        """Put a checkpoint's recurrent state back and cut the KV cache to match."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        buffer = point.payload
        read = llama_cpp.llama_state_seq_set_data_ext(
            self._context, _uint8_pointer(buffer), buffer.size, 0, flags
        )
        # The recurrent state now stands after ``position`` tokens; the attention
        # cells past it go (the recurrent part has nothing there to drop).
        if read != buffer.size or not llama_cpp.llama_memory_seq_rm(
            self._memory, 0, point.position, -1
        ):
            return False
        self.physical = point.position
        self._last_decode = 0
        self.restores += 1
        return True

    def _clear(self) -> None:
        llama_cpp.llama_memory_seq_rm(self._memory, 0, 0, -1)
        self.physical = 0
        self._last_decode = 0
        self._anchor = self._round = None


def _uint8_pointer(buffer: np.ndarray) -> Any:
    return buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def flush_replay(
    rollback: RecurrentRollback,
    tokens: Sequence[int],
    decode_at: Callable[[Sequence[int], int, int], None],
    batch: int,
) -> None:
    """Decode every token waiting to be replayed now, in batches, without logits."""
    pending = rollback.replay(tokens)
    for offset in range(0, len(pending), batch):
        chunk = pending[offset : offset + batch]
        decode_at(chunk, rollback.physical, len(chunk))
        rollback.decoded(len(chunk), len(chunk))
