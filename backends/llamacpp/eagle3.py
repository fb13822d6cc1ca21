"""An EAGLE-3 head (llama.cpp's ``eagle3`` architecture) drafting for a llama.cpp target.

An EAGLE-3 head is one small decoder block trained beside a target. It reads, for each
position ``p`` of the conversation, the inputs of three of the target's layers there
(``f_p``, concatenated: low, middle and high features). The head's encoder (``fc``)
projects them to ``g_p``; its decoder entry at position ``p`` reads the embedding of
the token after it, ``t_{p+1}``, beside ``g_p`` and predicts ``t_{p+2}``. Chained on
its own pre-norm output ``h'`` in place of ``g`` it drafts several tokens.

The bookkeeping, for a target that has evaluated positions ``0..n-1`` (its cache) and
whose next token ``t_n`` is pending:

- the target context extracts its layers' inputs (``llama_set_embeddings_layer_inp``)
  and every target decode leaves one feature row ``f_p`` per position; they are kept
  here until the head has used them;
- catching up encodes the kept rows of the positions the target accepted since the
  last round and adds the decoder entries ``(t_{p+1}, g_p)`` at ``p``, in one batch;
- the last of them, ``(t_n, g_{n-1})`` at ``n - 1``, gives the first draft's row (both
  are final, so that entry is kept); the chain then adds ``(d_1, h'_{n-1})`` at ``n``,
  and so on; the chained entries are dropped when the chain ends.

A target rollback drops the rows and the head's entries from the cut on. The draft's
``q`` is the head's own distribution (its logits, filtered like the target's), so the
loop accepts by exact rejection sampling.

Loading a head and refusing one trained for another target: ``eagle3_files``.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.errors import DecodeError, ModelLoadError
from backends.llamacpp.eagle3_files import get_layer_input, set_layer_input
from backends.llamacpp.library import last_llama_error, llama_cpp, note_decoding_thread
from backends.sampling.rows import HostRows

# After the library's guarded import, so that a missing runtime says how to install it.
llama_cpp_ext = importlib.import_module("llama_cpp.llama_cpp_ext")

# Target rows waiting beyond this many are read into the head at once (a prompt), so
# the rows kept, three target widths each, stay few.
EAGER_SYNC_ROWS = 64


class LlamaCppEagle3Head:
    """An EAGLE-3 head over a llama.cpp target: follows it and drafts a chain.

    ``weights`` (the head's loaded GGUF, owned and freed here) must have passed
    :func:`~backends.llamacpp.eagle3_files.load_eagle3_weights`'s checks against this target.
    """

    def __init__(
        self,
        target_context: Any,
        weights: Any,
        *,
        layer_ids: Sequence[int],
        target_embd: int,
        n_ctx: int,
        n_batch: int,
        threads: int,
        n_vocab: int,
    ) -> None:
        self._weights = weights
        self._target_context = target_context
        self.layer_ids = tuple(layer_ids)
        self.n_embd = int(llama_cpp.llama_model_n_embd(weights))
        self.target_embd = target_embd
        self.n_features = len(self.layer_ids) * target_embd
        self.n_vocab = n_vocab
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch  # the encoder reads a batch in one ubatch
        params.n_seq_max = 1
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        # The head borrows the target's token embeddings and LM head where it has none.
        params.ctx_other = target_context
        self._context = llama_cpp.llama_init_from_model(weights, params)
        if not self._context:
            llama_cpp.llama_model_free(weights)
            raise ModelLoadError("llama.cpp could not create a context for the EAGLE-3 head")
        self._memory = llama_cpp.llama_get_memory(self._context)
        self.n_batch = min(
            int(llama_cpp.llama_n_batch(self._context)),
            int(llama_cpp.llama_n_ubatch(self._context)),
        )
        for layer in self.layer_ids:
            set_layer_input(target_context, layer, True)
        # The head hands out g (encoder) and h' (decoder) for the rows it outputs.
        llama_cpp_ext.llama_set_embeddings_nextn(self._context, True, True)
        self._encoder = _Batch(self.n_batch, self.n_features, with_tokens=False)
        self._decoder = _Batch(self.n_batch, self.n_embd, with_tokens=True)
        self.synced = 0  # the head holds decoder entries for positions [0, synced)
        # The target's tokens and feature rows for positions [_rows_start, _rows_end).
        self._rows_start = 0
        self._row_tokens: list[int] = []
        self._rows = np.empty((0, self.n_features), dtype=np.float32)
        self._chain_end = 0  # next position of the chain being drafted
        self._last_output = 0  # the batch index of the last decode's output row
        self.decodes = 0  # for tests and measurements

    # -- following the target --------------------------------------------------------

    @property
    def _rows_end(self) -> int:
        return self._rows_start + len(self._row_tokens)

    def target_decoded(self, start: int, tokens: Sequence[int]) -> None:
        """The target evaluated ``tokens`` at positions from ``start``: keep its features."""
        count = len(tokens)
        layers = []
        for layer in self.layer_ids:
            pointer = get_layer_input(self._target_context, layer)
            if not pointer:
                return
            layers.append(np.ctypeslib.as_array(pointer, shape=(count, self.target_embd)))
        rows = np.concatenate(layers, axis=1)
        if start < self._rows_start or start > self._rows_end:
            self._rows_start, self._row_tokens = start, []
            self._rows = self._rows[:0]
        kept = start - self._rows_start
        self._row_tokens = [*self._row_tokens[:kept], *tokens]
        self._rows = np.concatenate([self._rows[:kept], rows])
        if self._rows_end - 1 - self.synced > EAGER_SYNC_ROWS:
            # Entry p reads t_{p+1}: the last row waits for the token after it.
            self._sync(self._rows_end - 1)

    def target_rolled_back(self, n_keep: int) -> None:
        """The target forgot positions from ``n_keep`` on: so does the head."""
        if self._rows_end > n_keep:
            kept = max(0, n_keep - self._rows_start)
            self._row_tokens = self._row_tokens[:kept]
            self._rows = self._rows[:kept]
        # Entry n_keep - 1 read t_{n_keep}, which the target just forgot.
        if self.synced > n_keep - 1:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, max(0, n_keep - 1), -1)
            self.synced = max(0, n_keep - 1)

    # -- drafting ---------------------------------------------------------------------

    def start(self, evaluated: int, context: Sequence[int]) -> HostRows | None:
        """Catch up with the target, which has evaluated ``context[:evaluated]``, up to
        the entry that reads the pending token ``context[evaluated]``, and chain any
        tokens after it (forced ones); the row for the first free draft, or None where
        the target's features before the pending token are not at hand."""
        if evaluated < 1 or evaluated >= len(context):
            return None
        if not self._rows_start <= evaluated - 1 < self._rows_end:
            return None
        if self._chain_end > self.synced or self.synced > evaluated - 1:
            # A chain left over, or the pending token's entry from an earlier proposal.
            keep = min(self.synced, evaluated - 1)
            llama_cpp.llama_memory_seq_rm(self._memory, 0, keep, -1)
            self.synced = keep
        # The pending token's entry alone, after the catch-up: its row (and so q) is
        # then computed alike whatever the catch-up held, proposal after proposal.
        self._sync(evaluated - 1, context)
        rows = self._sync(evaluated, context, logits=True)
        self._chain_end = self.synced
        for token in context[evaluated + 1 :]:
            rows = self.step(token)
        return rows

    def step(self, token: int) -> HostRows:
        """Chain one token after the last: the row for the token after it."""
        pointer = llama_cpp_ext.llama_get_embeddings_nextn_ith(self._context, self._last_output)
        if not pointer:
            raise DecodeError("llama.cpp gave no hidden state for the EAGLE-3 head to chain on")
        # The head's own pre-norm state, copied straight into the batch (no numpy view).
        hidden = self._decoder.embeddings
        ctypes.memmove(hidden.ctypes.data, pointer, hidden.strides[0])
        rows = self._decode([token], self._chain_end, None)
        self._chain_end += 1
        return rows

    def finish(self) -> None:
        """Drop the chained entries (they were read from the head's own states)."""
        if self._chain_end > self.synced:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, self.synced, -1)
        self._chain_end = self.synced

    def close(self) -> None:
        """Free the context, the batches and the head's weights."""
        for batch in (getattr(self, "_encoder", None), getattr(self, "_decoder", None)):
            if batch is not None:
                batch.free()
        self._encoder = self._decoder = None  # type: ignore[assignment]
        if self._context:
            llama_cpp.llama_free(self._context)
            self._context = None
        if self._weights:
            llama_cpp.llama_model_free(self._weights)
            self._weights = None

    # -- internals ------------------------------------------------------------------

    def _sync(
        self, end: int, context: Sequence[int] | None = None, *, logits: bool = False
    ) -> HostRows:
        """Add the decoder entries ``(t_{p+1}, g_p)`` for positions up to ``end``.

        ``t_{p+1}`` comes from ``context`` (the committed tokens and the pending one)
        or, without it, from the kept rows' tokens. Positions whose features are gone
        (a state restored whole) are skipped: the head then sees less context, which
        costs acceptance, never correctness. With ``logits``, the last entry's row.
        """
        first = max(self.synced, self._rows_start)
        rows = HostRows(np.empty((0, self.n_vocab), dtype=np.float32))
        for chunk in range(first, end, self.n_batch):
            stop = min(chunk + self.n_batch, end)
            features = self._rows[chunk - self._rows_start : stop - self._rows_start]
            if context is not None:
                following = context[chunk + 1 : stop + 1]
            else:
                following = self._row_tokens[
                    chunk + 1 - self._rows_start : stop + 1 - self._rows_start
                ]
            g = self._encode(features)
            rows = self._decode(following, chunk, g, logits=logits and stop == end)
        self.synced = max(self.synced, end)
        # Rows before the last entry are no longer needed (that one is read again when
        # a proposal's pending token replaces the token it read).
        drop = max(0, self.synced - 1 - self._rows_start)
        if drop:
            self._rows_start += drop
            self._row_tokens = self._row_tokens[drop:]
            self._rows = self._rows[drop:]
        return rows

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """``g`` for each row of ``features`` (the head's ``fc``), a copy."""
        count = len(features)
        batch = self._encoder
        # The encoder reads no positions, but llama.cpp checks that a batch's continue
        # the head's cache, so they are placeholders from its end.
        after = int(llama_cpp.llama_memory_seq_pos_max(self._memory, 0)) + 1
        batch.fill(count, np.arange(after, after + count), features, outputs=range(count))
        note_decoding_thread()
        status = llama_cpp.llama_encode(self._context, batch.batch)
        if status != 0:
            raise DecodeError(
                f"llama.cpp could not run the EAGLE-3 encoder (status {status}: "
                f"{last_llama_error()})"
            )
        pointer = llama_cpp_ext.llama_get_embeddings_nextn(self._context)
        return np.ctypeslib.as_array(pointer, shape=(count, self.n_embd)).copy()

    def _decode(
        self, tokens: Sequence[int], start: int, hidden: np.ndarray | None, *, logits: bool = True
    ) -> HostRows:
        """Decode ``tokens`` with ``hidden`` (None: already in the batch) from ``start``."""
        count = len(tokens)
        self._decoder.fill(
            count, np.arange(start, start + count), hidden, tokens, outputs=[count - 1]
        )
        note_decoding_thread()
        status = llama_cpp.llama_decode(self._context, self._decoder.batch)
        self.decodes += 1
        if status != 0:
            raise DecodeError(
                f"llama.cpp could not run the EAGLE-3 head (status {status}: {last_llama_error()})"
            )
        self._last_output = count - 1
        if not logits:
            return HostRows(np.empty((0, self.n_vocab), dtype=np.float32))
        pointer = llama_cpp.llama_get_logits_ith(self._context, count - 1)
        return HostRows(np.ctypeslib.as_array(pointer, shape=(1, self.n_vocab)))


class _Batch:
    """A ``llama_batch`` with numpy views of its arrays: embeddings per row, and token
    ids where the head's decoder reads them (an array of ours: llama.cpp allocates
    either tokens or embeddings, and the decoder's rows carry both)."""

    def __init__(self, size: int, width: int, *, with_tokens: bool) -> None:
        self.batch = llama_cpp.llama_batch_init(size, width, 1)
        self._token_ids = (llama_cpp.llama_token * size)() if with_tokens else None
        if self._token_ids is not None:
            self.batch.token = self._token_ids
            self.tokens = np.ctypeslib.as_array(self._token_ids, shape=(size,))
        self.positions = np.ctypeslib.as_array(self.batch.pos, shape=(size,))
        self.embeddings = np.ctypeslib.as_array(self.batch.embd, shape=(size, width))
        self.wants = np.ctypeslib.as_array(self.batch.logits, shape=(size,))
        np.ctypeslib.as_array(self.batch.n_seq_id, shape=(size,))[:] = 1
        for index in range(size):
            self.batch.seq_id[index][0] = 0

    def fill(
        self,
        count: int,
        positions: np.ndarray,
        embeddings: np.ndarray | None,
        tokens: Sequence[int] = (),
        *,
        outputs: Sequence[int] | range,
    ) -> None:
        """Set the first ``count`` rows (``embeddings`` None: left as they are)."""
        self.batch.n_tokens = count
        self.positions[:count] = positions
        if embeddings is not None:
            self.embeddings[:count] = embeddings
        if tokens:
            self.tokens[:count] = tokens
        self.wants[:count] = 0
        self.wants[list(outputs)] = 1

    def free(self) -> None:
        if self._token_ids is not None:
            self.batch.token = ctypes.POINTER(llama_cpp.llama_token)()  # ours, not malloc'd
        llama_cpp.llama_batch_free(self.batch)
