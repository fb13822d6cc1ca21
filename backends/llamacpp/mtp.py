"""A model's own multi-token-prediction (MTP, "nextn") head, run by llama.cpp.

Qwen3.5/3.6 (and DeepSeek V3, GLM-4.5, ...) ship one extra decoder block that
predicts the token after next: it reads the embedding of a token together with the
target's final hidden state at the position before it, and its own LM-head row is a
distribution over the next token. llama.cpp runs it in a second context of type
``LLAMA_CONTEXT_TYPE_MTP`` on the same weights (or on a separate MTP-only GGUF); that
context keeps a KV cache of its own, one entry per position of the conversation.

The bookkeeping, for a target that has evaluated positions ``0..n-1`` (its cache) and
whose next token ``t_n`` is pending:

- the target context is asked for its hidden states (``llama_set_embeddings_nextn``)
  and every target decode leaves one row ``h_p`` per position; they are kept here
  until the MTP context has used them (a prompt's rows are used a batch at a time);
- the MTP entry at position ``p`` reads ``(t_p, h_{p-1})``: catching up means one
  batch of those for the positions the target accepted since the last round;
- drafting reads ``(t_n, h_{n-1})`` at ``n`` (that entry is kept: both are final),
  then chains on its own: ``(d_1, g_n)`` at ``n + 1`` where ``g`` is the head's own
  hidden state, and so on; the chained entries are dropped when the chain ends.

A target rollback drops the rows and the MTP entries from the cut on. The draft's
``q`` is the head's own distribution (its logits, filtered like the target's), so the
loop accepts by exact rejection sampling.

This module and ``backends/llamacpp*.py`` are the only ones that import ``llama_cpp``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from backends.errors import DecodeError, ModelLoadError
from backends.llamacpp.library import check_gguf_file, note_decoding_thread
from backends.llamacpp.placement import local_placement
from backends.sampling.rows import HostRows

# Target rows waiting beyond this many are fed to the MTP context at once (a prompt,
# or rounds that drafted otherwise), so the rows kept, and copied, stay few.
EAGER_SYNC_ROWS = 64


class LlamaCppMtpHead:
    """The MTP head of a llama.cpp target: catches up with it and drafts a chain.

    ``weights`` is the llama.cpp model holding the nextn layers: the target's own
    (a GGUF that keeps them) or a separate MTP-only GGUF, which ``owns_weights`` frees.
    """

    def __init__(
        self,
        target_context: Any,
        weights: Any,
        *,
        n_ctx: int,
        n_batch: int,
        threads: int,
        n_vocab: int,
        owns_weights: bool = False,
    ) -> None:
        self._weights = weights
        self._owns_weights = owns_weights
        self.layers = int(llama_cpp.llama_model_n_layer_nextn(weights))
        self.n_embd = int(llama_cpp.llama_model_n_embd(weights))
        self.n_vocab = n_vocab
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_rs_seq = 0
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target_context
        self._context = llama_cpp.llama_init_from_model(weights, params)
        if not self._context:
            raise ModelLoadError("llama.cpp could not create a context for the model's MTP head")
        self._target_context = target_context
        self._memory = llama_cpp.llama_get_memory(self._context)
        self.n_batch = min(
            int(llama_cpp.llama_n_batch(self._context)),
            int(llama_cpp.llama_n_ubatch(self._context)),
        )
        # The target hands over its hidden state at every position (all rows: a
        # prompt's too), the head its own at the rows it outputs (for chaining).
        llama_cpp_ext.llama_set_embeddings_nextn(target_context, True, False)
        llama_cpp_ext.llama_set_embeddings_nextn(self._context, True, True)
        # One batch carrying both a token and a hidden state per row: llama.cpp
        # allocates the hidden states (embd), the token ids are an array of ours.
        self._batch = llama_cpp.llama_batch_init(self.n_batch, self.n_embd, 1)
        self._token_ids = (llama_cpp.llama_token * self.n_batch)()
        self._batch.token = self._token_ids
        self._batch_tokens = np.ctypeslib.as_array(self._token_ids, shape=(self.n_batch,))
        self._batch_positions = np.ctypeslib.as_array(self._batch.pos, shape=(self.n_batch,))
        self._batch_hidden = np.ctypeslib.as_array(
            self._batch.embd, shape=(self.n_batch, self.n_embd)
        )
        self._batch_wants = np.ctypeslib.as_array(self._batch.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.n_batch,))[:] = 1
        for index in range(self.n_batch):
            self._batch.seq_id[index][0] = 0
        self.synced = 0  # the MTP cache holds positions [0, synced)
        # The target's tokens and hidden states for positions [_rows_start, _rows_end).
        self._rows_start = 0
        self._row_tokens: list[int] = []
        self._rows = np.empty((0, self.n_embd), dtype=np.float32)
        self._chain_end = 0  # next position of the chain being drafted
        self._last_output = 0  # the batch index of the last decode's output row
        # A view of the logits row, kept while llama.cpp's buffer stays where it is
        # (making one costs ~90 us; see LlamaCppModel._logits_view).
        self._logits_address = 0
        self._logits_row = np.empty((1, n_vocab), dtype=np.float32)
        self.decodes = 0  # for tests and measurements

    # -- following the target --------------------------------------------------------

    @property
    def _rows_end(self) -> int:
        return self._rows_start + len(self._row_tokens)

    def target_decoded(self, start: int, tokens: Sequence[int]) -> None:
        """The target evaluated ``tokens`` at positions from ``start``: keep its rows."""
        pointer = llama_cpp_ext.llama_get_embeddings_nextn(self._target_context)
        if not pointer:
            return
        rows = np.ctypeslib.as_array(pointer, shape=(len(tokens), self.n_embd))
        if start < self._rows_start or start > self._rows_end:
            self._rows_start, self._row_tokens = start, []
            self._rows = self._rows[:0]
        kept = start - self._rows_start
        self._row_tokens = [*self._row_tokens[:kept], *tokens]
        self._rows = np.concatenate([self._rows[:kept], rows])
        if self._rows_end - self.synced > EAGER_SYNC_ROWS:
            self._sync(self._rows_end)

    def target_rolled_back(self, n_keep: int) -> None:
        """The target forgot positions from ``n_keep`` on: so does the head."""
        if self._rows_end > n_keep:
            kept = max(0, n_keep - self._rows_start)
            self._row_tokens = self._row_tokens[:kept]
            self._rows = self._rows[:kept]
        if self.synced > n_keep:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, n_keep, -1)
            self.synced = n_keep

    # -- drafting ---------------------------------------------------------------------

    def start(self, evaluated: int, context: Sequence[int]) -> HostRows | None:
        """Catch up with the target, which has evaluated ``context[:evaluated]``, and
        read the pending token ``context[evaluated]`` and any tokens after it (forced
        ones); the row for the first free draft, or None where the target's hidden
        state before the pending token is not at hand (then nothing is drafted)."""
        if evaluated >= len(context) or not self._has_row(evaluated - 1):
            return None
        if self.synced > evaluated or self._chain_end > self.synced:
            # The pending token's entry from an earlier proposal, or a chain left over.
            llama_cpp.llama_memory_seq_rm(self._memory, 0, min(self.synced, evaluated), -1)
            self.synced = min(self.synced, evaluated)
        self._sync(evaluated)
        hidden = self._row(evaluated - 1)
        rows = self._decode([context[evaluated]], evaluated, hidden)
        self.synced = evaluated + 1  # (t_n, h_{n-1}) is final: kept
        self._chain_end = self.synced
        for token in context[evaluated + 1 :]:
            rows = self.step(token)
        return rows

    def step(self, token: int) -> HostRows:
        """Chain one token after the last: the row for the token after it."""
        # The head's own hidden state, copied straight into the batch (no numpy view).
        pointer = llama_cpp_ext.llama_get_embeddings_nextn_ith(self._context, self._last_output)
        if not pointer:
            raise DecodeError("llama.cpp gave no hidden state for the MTP head to chain on")
        ctypes.memmove(self._batch_hidden.ctypes.data, pointer, self._batch_hidden.strides[0])
        rows = self._decode([token], self._chain_end, None)
        self._chain_end += 1
        return rows

    def finish(self) -> None:
        """Drop the chained entries (they were read from the head's own states)."""
        if self._chain_end > self.synced:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, self.synced, -1)
        self._chain_end = self.synced

    def close(self) -> None:
        """Free the context, the batch and (if owned) the MTP-only weights."""
        if self._batch is not None:
            self._batch.token = ctypes.POINTER(llama_cpp.llama_token)()  # ours, not malloc'd
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._context:
            llama_cpp.llama_free(self._context)
            self._context = None
        if self._owns_weights and self._weights:
            llama_cpp.llama_model_free(self._weights)
            self._weights = None

    # -- internals ------------------------------------------------------------------

    def _has_row(self, position: int) -> bool:
        return position < 0 or self._rows_start <= position < self._rows_end

    def _row(self, position: int) -> np.ndarray:
        """``h_position`` as a (1, n_embd) array; zeros before the first position."""
        if position < 0:
            return np.zeros((1, self.n_embd), dtype=np.float32)
        offset = position - self._rows_start
        return self._rows[offset : offset + 1]

    def _sync(self, end: int) -> None:
        """Add the MTP entries ``(t_p, h_{p-1})`` for positions up to ``end``.

        Positions whose ``h_{p-1}`` is gone (a state restored whole, rows from before
        the head existed) are skipped: the head then sees less context, which costs
        acceptance, never correctness.
        """
        first = max(self.synced, self._rows_start + 1 if self._rows_start > 0 else 0)
        end = min(end, self._rows_end)
        for chunk in range(first, end, self.n_batch):
            stop = min(chunk + self.n_batch, end)
            offset = chunk - self._rows_start
            tokens = self._row_tokens[offset : offset + stop - chunk]
            hidden = (
                self._rows[offset - 1 : offset - 1 + stop - chunk]
                if chunk > 0
                else np.vstack([self._row(-1), self._rows[: stop - chunk - 1]])
            )
            self._decode(tokens, chunk, hidden, logits=False)
        self.synced = max(self.synced, end)
        # Rows before the last synced position are no longer needed.
        drop = max(0, self.synced - 1 - self._rows_start)
        if drop:
            self._rows_start += drop
            self._row_tokens = self._row_tokens[drop:]
            self._rows = self._rows[drop:]

    def _decode(
        self, tokens: Sequence[int], start: int, hidden: np.ndarray | None, *, logits: bool = True
    ) -> HostRows:
        """Decode ``tokens`` with ``hidden`` (None: already in the batch) from ``start``."""
        count = len(tokens)
        batch = self._batch
        batch.n_tokens = count
        self._batch_tokens[:count] = tokens
        self._batch_positions[:count] = np.arange(start, start + count)
        if hidden is not None:
            self._batch_hidden[:count] = hidden
        self._batch_wants[:count] = 0
        if logits:
            self._batch_wants[count - 1] = 1
        note_decoding_thread()
        status = llama_cpp.llama_decode(self._context, batch)
        self.decodes += 1
        if status != 0:
            raise DecodeError(f"llama.cpp could not run the MTP head (status {status})")
        self._last_output = count - 1
        if not logits:
            return HostRows(np.empty((0, self.n_vocab), dtype=np.float32))
        pointer = llama_cpp.llama_get_logits_ith(self._context, count - 1)
        address = ctypes.addressof(pointer.contents)
        if address != self._logits_address:
            self._logits_row = np.ctypeslib.as_array(pointer, shape=(1, self.n_vocab))
            self._logits_address = address
        return HostRows(self._logits_row)


def load_mtp_weights(path: Path, target: Any, target_name: str, *, gpu_layers: int) -> Any:
    """Load a separate GGUF holding ``target``'s MTP head (this machine's devices alone:
    the head drafts, and drafting never waits on a worker); the caller owns the weights."""
    check_gguf_file(path)
    params = llama_cpp.llama_model_default_params()
    local_placement(gpu_layers).apply(params)
    params.load_mtp = True
    weights = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not weights:
        raise ModelLoadError(f"llama.cpp could not load the MTP head {path}")
    if llama_cpp.llama_model_n_layer_nextn(weights) <= 0 or llama_cpp.llama_model_n_embd(
        weights
    ) != llama_cpp.llama_model_n_embd(target):
        llama_cpp.llama_model_free(weights)
        raise ModelLoadError(f"{path} holds no MTP head for {target_name}")
    return weights
