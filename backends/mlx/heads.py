"""EAGLE-3 and DFlash heads drafting for an MLX target: mlx-vlm's head models, kept in
step with the target's cache by draftpen and drafting for draftpen's loop.

mlx-vlm ships the heads' model classes (their layers, weights and forward) inside its
own generation loop. Here the forward is mlx-vlm's and the bookkeeping is ours, as for
llama.cpp's heads (backends/llamacpp/eagle3.py and dflash.py say what each head reads):
the target hands each head the outputs of the layers it reads at every position it
evaluates (:class:`~backends.mlx.layer_capture.LayerCapture`), kept until the head's
cache has read them; a target rollback cuts both back; a round's drafting entries are
trimmed when it ends, so the head's cache holds what the target accepted and nothing
else. Each draft's row is the head's own distribution over the target's vocabulary, so
the loop accepts by exact rejection sampling.

The head's cache is a list of mlx-vlm ``KVCache`` objects whose entries are contiguous:
entry ``i`` is position ``base + i``; a gap in the target's rows (a state restored
whole) starts the head's cache afresh at the first position it has rows for.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Self

import mlx.core as mx
import numpy as np

from backends.mlx.device_rows import MlxRows
from backends.mlx.head_files import LoadedHead
from backends.sampling.rows import HostRows, LogitRows
from backends.target_rows import TargetRows

# Target rows waiting beyond this many are read into the head at once (a prompt), so
# the rows kept, several target widths each, stay few.
EAGER_SYNC_ROWS = 64
SYNC_CHUNK = 512  # positions a head reads in one forward


class MlxHead:
    """What both heads share: the kept target rows, the head's cache and its trimming.

    ``ENTRY_LAG``: how far before a position's target row the head's entry for it sits
    (EAGLE-3's entry ``p`` reads the token at ``p + 1``).
    """

    # Target rows kept behind the head's entries (TargetRows.keep_behind): a head whose
    # entry reads the row before its position needs the row before a rollback's cut.
    KEEP_BEHIND = 0

    ENTRY_LAG = 0

    def __init__(self, loaded: LoadedHead, target_model: Any, *, device_sampling: bool) -> None:
        self.kind = loaded.kind
        self.model = loaded.model
        self.capture_layer_ids = loaded.capture_layer_ids
        self.model.bind(target_model)  # shares the target's token embeddings
        self._device_sampling = device_sampling
        self._start_following()

    def _start_following(self) -> None:
        """The state that follows one sequence of the target, empty."""
        self._kept = TargetRows(
            0, empty=mx.zeros((0, 0)), concatenate=_concatenate, keep_behind=self.KEEP_BEHIND
        )
        self._cache: list[Any] = self.model.make_cache()
        self._base = 0  # the position of the cache's first entry
        self.synced = 0  # the head's cache holds the target's entries before this position
        self.decodes = 0  # head forwards, for tests and measurements

    def for_sequence(self) -> Self:
        """A head over the same loaded weights that follows another sequence of the
        target (a parallel model's view, backends/sequence_head.py): a state of its
        own, its rows sampled on the host, as the views sample the target's."""
        other = copy.copy(self)  # the head's model and facts are shared, never changed
        other._device_sampling = False
        other._start_following()
        return other

    # -- following the target --------------------------------------------------------

    def target_decoded(self, start: int, tokens: Sequence[int], rows: mx.array) -> None:
        """The target evaluated ``tokens`` from ``start``; ``rows`` are the outputs of the
        layers the head reads there, ``(1, len(tokens), width)``."""
        self._kept.add(start, tokens, rows[0])
        if self._kept.end - self.ENTRY_LAG - self.synced > EAGER_SYNC_ROWS:
            self._sync(self._kept.end - self.ENTRY_LAG)

    def target_rolled_back(self, n_keep: int) -> None:
        """The target forgot positions from ``n_keep`` on: so does the head."""
        self._kept.cut(n_keep)
        self._forget_from(max(0, n_keep - self.ENTRY_LAG))

    def target_replaced(self) -> None:
        """The target's cache was replaced whole: nothing kept applies any more."""
        self._kept.forget()
        self._restart_at(0)

    def finish(self) -> None:
        """The round's drafting is over: drop its entries."""
        self._forget_from(self.synced)

    # -- internals ------------------------------------------------------------------

    def _entries(self) -> int:
        return int(self._cache[0].offset) if self._cache else 0

    def _forget_from(self, position: int) -> None:
        """Drop the head's entries from ``position`` on (and any drafting ones)."""
        keep = position - self._base
        if keep < 0:
            self._restart_at(position)
            return
        extra = self._entries() - keep
        if extra > 0:
            for cache in self._cache:
                cache.trim(extra)
        self.synced = min(self.synced, position)

    def _restart_at(self, position: int) -> None:
        self._cache = self.model.make_cache()
        self._base = self.synced = position

    def _readable_from(self) -> int:
        """The first position the head reads next; a gap before the kept rows (a state
        restored whole) starts its cache afresh there, with less context (which costs
        acceptance, never correctness)."""
        first = max(self.synced, self._kept.start)
        if first > self.synced:
            self._restart_at(first)
        return first

    def _sync(self, end: int) -> None:  # pragma: no cover - each head reads its own way
        raise NotImplementedError

    def _rows(self, logits: mx.array) -> LogitRows:
        """Rows over the target's vocabulary, float32, where the loop samples them;
        evaluated here, so the head's forward is timed as the head's (``auto`` prices it)
        and not as the host time of whoever reads the row first."""
        logits = logits.astype(mx.float32)
        if self._device_sampling:
            mx.eval(logits)
            return MlxRows(logits)
        return HostRows(np.array(logits, copy=False))


class MlxEagle3Head(MlxHead):
    """An EAGLE-3 head over an MLX target: follows it and drafts a chain (mlx-vlm's
    ``Eagle3DraftModel``: the encoder ``fc`` over the target's features, its decoder
    block, a vocabulary of its own mapped to the target's by ``d2t``)."""

    KEEP_BEHIND = 64  # entry p reads t_{p+1}: a new turn of a chat cuts back a few

    ENTRY_LAG = 1  # entry p reads the token at p + 1

    def __init__(self, loaded: LoadedHead, target_model: Any, *, n_vocab: int, **kwargs: Any):
        super().__init__(loaded, target_model, **kwargs)
        self.n_vocab = n_vocab
        d2t = self.model.d2t
        self._target_ids = None if d2t is None else mx.arange(d2t.shape[0]) + d2t
        # Computed now, as the weights are: a lazy array runs on the stream of the thread
        # that built it, which a parallel model's runtime thread cannot use.
        if self._target_ids is not None:
            mx.eval(self._target_ids)

    def _start_following(self) -> None:
        super()._start_following()
        self._chain_hidden: mx.array | None = None  # h' of the last entry, to chain on
        self._chain_end = 0

    def start(self, evaluated: int, context: Sequence[int]) -> LogitRows | None:
        """Catch up with the target, which has evaluated ``context[:evaluated]``, up to
        the entry that reads the pending token ``context[evaluated]``, and chain any
        tokens after it (forced ones); the row for the first free draft, or None where
        the target's features before the pending token are not at hand."""
        if evaluated < 1 or evaluated >= len(context) or not self._kept.holds(evaluated - 1):
            return None
        self._forget_from(min(self.synced, evaluated - 1))
        self._sync(evaluated - 1, context)
        # The pending token's entry alone: its row is then the same, round after round.
        hidden = self._entries_for(evaluated - 1, evaluated, context)
        self.synced = evaluated
        self._chain_end = evaluated
        rows = self._chain_row(hidden)
        for token in context[evaluated + 1 :]:
            rows = self.step(token)
        return rows

    def step(self, token: int) -> LogitRows:
        """Chain one token after the last: the row for the token after it."""
        assert self._chain_hidden is not None, "step() follows start()"
        hidden = self._forward([token], self._chain_hidden, self._chain_end)
        self._chain_end += 1
        return self._chain_row(hidden)

    def _chain_row(self, hidden: mx.array) -> LogitRows:
        self._chain_hidden = hidden[:, -1:, :]
        logits = self.model._logits(self._chain_hidden)[0]
        if self._target_ids is not None:  # the head's vocabulary is a part of the target's
            full = mx.full((1, self.n_vocab), -mx.inf, dtype=logits.dtype)
            full[:, self._target_ids] = logits
            logits = full
        return self._rows(logits)

    def _sync(self, end: int, context: Sequence[int] | None = None) -> None:
        """Add the entries ``(t_{p+1}, g_p)`` for positions up to ``end`` (``t_{p+1}``
        from ``context``, or without it from the kept rows' tokens)."""
        first = self._readable_from()
        for chunk in range(first, end, SYNC_CHUNK):
            self._entries_for(chunk, min(chunk + SYNC_CHUNK, end), context)
        self.synced = max(self.synced, end)
        mx.eval([cache.state for cache in self._cache])
        # The last entry's row is read again when a pending token replaces its token.
        self._kept.drop_before(self.synced - 1)

    def _entries_for(self, first: int, stop: int, context: Sequence[int] | None) -> mx.array:
        kept = self._kept
        if context is not None:
            following = context[first + 1 : stop + 1]
        else:
            following = kept.tokens[first + 1 - kept.start : stop + 1 - kept.start]
        features = kept.between(first, stop)[None]
        return self._forward(following, features, first)

    def _forward(self, tokens: Sequence[int], hidden: mx.array, position: int) -> mx.array:
        """The head's entries for ``tokens`` beside ``hidden`` (target features, or its
        own last output) from ``position``; their outputs ``h'``."""
        self.model._cache = self._cache
        self.model._next_position = position - self._base
        self.decodes += 1
        ids = mx.array([list(tokens)], dtype=mx.int32)
        return self.model._forward_tokens(ids, hidden, mx.int32)


class MlxBlockHead(MlxHead):
    """A DFlash head over an MLX target: follows it and drafts a block in one forward
    (mlx-vlm's ``DFlashDraftModel``, whose cache holds the target's projected features
    and never the block's)."""

    def __init__(self, loaded: LoadedHead, target_model: Any, **kwargs: Any) -> None:
        super().__init__(loaded, target_model, **kwargs)
        self.block_size = int(self.model.config.block_size)
        self.mask_token = int(self.model.config.mask_token_id)

    @property
    def max_drafts(self) -> int:
        """The most tokens one block drafts (the head's trained block, less its anchor)."""
        return self.block_size - 1

    def draft_block(self, evaluated: int, context: Sequence[int], drafts: int) -> LogitRows | None:
        """Catch up with the target, which has evaluated ``context[:evaluated]``, and
        decode one block: ``context[evaluated:]`` (the pending token and any forced
        after it) then mask tokens. The rows of up to ``drafts`` drafting slots, in
        order; None where the head cannot draft here."""
        given = len(context) - evaluated
        drafts = min(drafts, self.block_size - given)
        if given < 1 or drafts < 1 or evaluated < 1:
            return None
        self._forget_from(min(self.synced, evaluated))
        if self.synced < evaluated and not self._kept.holds(evaluated - 1):
            return None
        self._sync(evaluated, keep_last=True)
        # The block reads the features not yet in the cache; with none new, the last
        # one is read again (an empty context is not a forward mlx-vlm takes).
        if self.synced == evaluated and self._kept.holds(evaluated - 1):
            self._forget_from(evaluated - 1)
        first = self._readable_from()
        if first >= evaluated:
            return None  # no feature left to read beside the block
        tokens = [*context[evaluated:], *[self.mask_token] * drafts]
        hidden = self._forward(tokens, self._kept.between(first, evaluated))
        self.synced = evaluated
        # Only the drafting slots' rows go through the LM head (the largest matmul).
        return self._rows(self.model._logits(hidden[0, given : given + drafts]))

    def _sync(self, end: int, *, keep_last: bool = False) -> None:
        """Read the kept features of positions up to ``end`` (those not read yet), the
        last left out where the block will read it."""
        first = self._readable_from()
        stop = min(end, self._kept.end) - (1 if keep_last else 0)
        for chunk in range(first, stop, SYNC_CHUNK):
            chunk_end = min(chunk + SYNC_CHUNK, stop)
            # A block of one mask token reads them; only the cache is evaluated.
            self._forward([self.mask_token], self._kept.between(chunk, chunk_end))
            mx.eval([cache.state for cache in self._cache])
            self.synced = chunk_end
        self._kept.drop_before(max(self.synced - 1, 0))

    def _forward(self, tokens: Sequence[int], features: mx.array) -> mx.array:
        """The block's final hidden states (the features read into the cache first)."""
        self.decodes += 1
        ids = mx.array([list(tokens)], dtype=mx.int32)
        return self.model._hidden(ids, features[None], self._cache)


def _concatenate(arrays: Sequence[mx.array]) -> mx.array:
    parts = [array for array in arrays if array.size]
    if not parts:
        return arrays[-1]
    return mx.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
