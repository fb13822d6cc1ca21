"""Several conversations' KV state kept in RAM, so interleaved conversations stay cheap.

A model has one KV cache. When an agent's conversation and a chat take turns on one
engine, each turn would otherwise find the cache full of the other conversation and
read its whole prompt again (a 4,000-token agent prompt is a minute of a 2-core CPU).

Before a model reads a prompt, :meth:`ConversationCache.prepare`:

1. keeps a copy of the live cache if this prompt is about to overwrite a stretch of it
   worth keeping (the conversation that was running is saved when it is left, not
   after every turn: a chat that simply goes on never pays for a copy);
2. brings back the kept state that shares the longest prefix with the prompt, when
   that beats what the live cache already shares with it.

The loop then reuses the common prefix as it always does and reads only the rest.
States live under one byte budget; the least recently used go first. Only models
that implement :class:`~backends.base.SavesSequenceState` take part.

A model with a recurrent state (hybrid Qwen3.5/3.6; its ``recurrent`` attribute is
true) cannot cut a state back to a shorter prefix: a kept state serves only a prompt
that extends it whole, a longer kept state does not stand in for a shorter one, and
the live cache spares only what the model's own checkpoints reach
(``reusable_prefix``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from backends.base import Model, SavesSequenceState, SequenceState, reusable_prefix
from backends.errors import DecodeError
from backends.token_prefix import common_prefix_length

# Overwriting fewer tokens than this is not worth a copy of the state: reading them
# again costs about what copying it out would.
MIN_KEPT_TOKENS = 8
# A restore copies the whole state back, so it must spare reading at least this many
# tokens (a copy costs about what reading a few tokens does, on a CPU and on a GPU).
MIN_RESTORE_GAIN = 8


@dataclass(frozen=True)
class ConversationCacheStats:
    """What the cache holds and has done, for ``/health`` and the benchmark."""

    budget_bytes: int
    used_bytes: int
    entries: int
    saved: int  # states copied out of a model's cache
    restored: int  # states put back into a model's cache
    restored_tokens: int  # prompt tokens those restores spared reading (before trimming)
    evicted: int  # states dropped to stay within the budget (or too large for it)
    failed: int  # saves or restores the runtime refused (the prompt was read instead)
    save_seconds: float = 0.0  # time spent copying states out
    restore_seconds: float = 0.0  # time spent copying states back

    def as_dict(self) -> dict[str, int | float]:
        """Plain data for JSON."""
        return {
            "budget_bytes": self.budget_bytes,
            "used_bytes": self.used_bytes,
            "entries": self.entries,
            "saved": self.saved,
            "restored": self.restored,
            "restored_tokens": self.restored_tokens,
            "evicted": self.evicted,
            "failed": self.failed,
            "save_seconds": round(self.save_seconds, 4),
            "restore_seconds": round(self.restore_seconds, 4),
        }


@dataclass(frozen=True, eq=False)
class _Entry:
    role: str
    state: SequenceState


class ConversationCache:
    """Saved KV states of several conversations, per model role, under a byte budget.

    ``role`` names the model a state belongs to ("target", "draft"): a state is only
    ever restored into the model that saved it. Thread-safe for reading ``stats`` while
    the engine's one worker thread calls ``prepare``.
    """

    def __init__(
        self,
        budget_bytes: int,
        *,
        min_tokens: int = MIN_KEPT_TOKENS,
        min_gain: int = MIN_RESTORE_GAIN,
    ) -> None:
        if budget_bytes < 0:
            raise ValueError("the conversation cache budget must be 0 bytes or more")
        self.budget_bytes = budget_bytes
        self.min_tokens = max(1, min_tokens)
        self.min_gain = max(1, min_gain)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next_key = 0
        self._used_bytes = 0
        self._lock = threading.Lock()
        self._saved = self._restored = self._restored_tokens = 0
        self._evicted = self._failed = 0
        self._save_seconds = self._restore_seconds = 0.0

    def prepare(self, role: str, model: Model, prompt: Sequence[int]) -> int:
        """Get ``model``'s cache ready to read ``prompt``; return the prefix it now shares.

        Keeps the live state if the prompt would overwrite a worthwhile stretch of it,
        and restores the kept state closest to the prompt if it shares more than the
        live cache does. A model that cannot save its state is left as it is.
        """
        live = list(model.cached_tokens)
        live_shared = common_prefix_length(live, prompt)
        if not isinstance(model, SavesSequenceState):
            return live_shared
        whole = bool(getattr(model, "recurrent", False))
        best_key, best_shared = self._closest(role, prompt, whole_only=whole)
        # What the live cache really spares once cut back to the shared prefix.
        live_kept = reusable_prefix(model, live_shared)
        restore = best_key is not None and best_shared >= live_kept + self.min_gain
        entry: _Entry | None = None
        if restore and best_key is not None:
            with self._lock:
                # The state about to be used is the most recently used one, so keeping
                # the live state below evicts others first. (If a tight budget evicts
                # it too, the restore still uses it: it is about to be the live state.)
                self._entries.move_to_end(best_key)
                entry = self._entries[best_key]
        # What the prompt is about to overwrite: everything, if another state replaces
        # the live one; else what lies past the shared prefix (the loop rolls it back).
        overwritten = len(live) if restore else len(live) - live_shared
        if overwritten >= self.min_tokens:
            self._keep(role, model, live, cuts=not whole)
        if entry is None or best_key is None:
            return live_shared
        started = time.perf_counter()
        try:
            model.restore_state(entry.state)
        except DecodeError:
            # The runtime left the cache empty; the loop reads the whole prompt.
            with self._lock:
                self._failed += 1
                self._drop(best_key)
            return 0
        with self._lock:
            self._restored += 1
            self._restored_tokens += best_shared
            self._restore_seconds += time.perf_counter() - started
        return best_shared

    def stats(self) -> ConversationCacheStats:
        """A consistent snapshot of the figures."""
        with self._lock:
            return ConversationCacheStats(
                budget_bytes=self.budget_bytes,
                used_bytes=self._used_bytes,
                entries=len(self._entries),
                saved=self._saved,
                restored=self._restored,
                restored_tokens=self._restored_tokens,
                evicted=self._evicted,
                failed=self._failed,
                save_seconds=self._save_seconds,
                restore_seconds=self._restore_seconds,
            )

    def clear(self) -> None:
        """Forget every kept state (their memory is freed); the figures stay."""
        with self._lock:
            self._entries.clear()
            self._used_bytes = 0

    # -- the parts -------------------------------------------------------------

    def _closest(
        self, role: str, prompt: Sequence[int], *, whole_only: bool = False
    ) -> tuple[int | None, int]:
        """The kept state of ``role`` sharing the longest prefix with ``prompt``
        (with ``whole_only``, among those the prompt extends whole)."""
        best_key: int | None = None
        best_shared = 0
        with self._lock:
            candidates = [
                (key, entry) for key, entry in self._entries.items() if entry.role == role
            ]
        for key, entry in candidates:
            shared = common_prefix_length(entry.state.tokens, prompt)
            if whole_only and shared < len(entry.state.tokens):
                continue
            if shared > best_shared:
                best_key, best_shared = key, shared
        return best_key, best_shared

    def _keep(
        self, role: str, model: SavesSequenceState, live: list[int], *, cuts: bool = True
    ) -> None:
        """Save the live state unless a kept one already covers it; then fit the budget.

        ``cuts`` False (a recurrent state): only a kept state of exactly these tokens
        covers it, and a shorter kept one is not made redundant by it.
        """
        if self.budget_bytes == 0:
            return
        with self._lock:
            for key, entry in self._entries.items():
                kept = entry.state.tokens
                if (
                    entry.role == role
                    and (len(kept) >= len(live) if cuts else len(kept) == len(live))
                    and list(kept[: len(live)]) == live
                ):
                    # A kept state extends this one: restoring it and rolling back gives
                    # the live state, so no copy is needed. It was just in use: refresh it.
                    self._entries.move_to_end(key)
                    return
        started = time.perf_counter()
        try:
            state = model.save_state()
        except DecodeError:
            with self._lock:
                self._failed += 1
            return
        with self._lock:
            self._saved += 1
            self._save_seconds += time.perf_counter() - started
            # States this one extends are now redundant.
            covered = [
                key
                for key, entry in self._entries.items()
                if entry.role == role
                and (
                    len(entry.state.tokens) <= len(state.tokens)
                    if cuts
                    else entry.state.tokens == state.tokens
                )
                and entry.state.tokens == state.tokens[: len(entry.state.tokens)]
            ]
            for key in covered:
                self._drop(key)
            if state.nbytes > self.budget_bytes:
                self._evicted += 1  # larger than the whole budget: never kept
                return
            self._entries[self._next_key] = _Entry(role, state)
            self._next_key += 1
            self._used_bytes += state.nbytes
            while self._used_bytes > self.budget_bytes:
                oldest = next(iter(self._entries))
                self._drop(oldest)
                self._evicted += 1

    def _drop(self, key: int) -> None:
        """Forget one entry (the lock is held)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._used_bytes -= entry.state.nbytes
