"""What every llama.cpp draft head shares: the MTP head (``mtp``), EAGLE-3 heads
(``eagle3``) and DFlash/DSpark block heads (``dflash``).

A head runs in a llama.cpp context of its own beside the target's and follows the
target's cache. Each target decode hands it one row per evaluated position (a hidden
state, or the inputs of some of the target's layers), kept here (``TargetRows``)
until the head's own cache has read them; each target rollback cuts both back. A round
drafts from entries added after the target's (a chain, or a block), which
:meth:`LlamaCppHead.finish` drops again, so the head's cache holds what the target
accepted and nothing else. The bookkeeping of what each entry reads is each head's own.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.errors import DecodeError, ModelLoadError
from backends.llamacpp.eagle3_files import get_layer_input
from backends.llamacpp.library import last_llama_error, llama_cpp, note_decoding_thread
from backends.sampling.rows import HostRows
from backends.target_rows import TargetRows

# After the library's guarded import, so that a missing runtime says how to install it.
llama_cpp_ext = importlib.import_module("llama_cpp.llama_cpp_ext")


class HeadBatch:
    """A ``llama_batch`` with numpy views of its arrays: embeddings per row (``width``
    wide; none with ``width`` 0), and token ids where the head reads them (an array of
    ours where the rows carry both: llama.cpp allocates either tokens or embeddings).
    Every row of a fill belongs to one sequence of the head's context (its ``seq``)."""

    def __init__(self, size: int, width: int, *, with_tokens: bool) -> None:
        self.batch = llama_cpp.llama_batch_init(size, width, 1)
        self._token_ids = None
        if with_tokens and width > 0:
            self._token_ids = (llama_cpp.llama_token * size)()
            self.batch.token = self._token_ids
        if with_tokens:
            self.tokens = np.ctypeslib.as_array(self.batch.token, shape=(size,))
        self.positions = np.ctypeslib.as_array(self.batch.pos, shape=(size,))
        if width > 0:
            self.embeddings = np.ctypeslib.as_array(self.batch.embd, shape=(size, width))
        self.wants = np.ctypeslib.as_array(self.batch.logits, shape=(size,))
        np.ctypeslib.as_array(self.batch.n_seq_id, shape=(size,))[:] = 1
        for index in range(size):
            self.batch.seq_id[index][0] = 0
        # Rows [0, _seq_rows) hold sequence _rows_seq: a head of one sequence sets them
        # once; heads of several (a parallel context's) rewrite them when they change.
        self._rows_seq = 0
        self._seq_rows = size

    def _set_sequence(self, count: int, seq: int) -> None:
        first = 0 if seq != self._rows_seq else self._seq_rows
        for index in range(first, count):
            self.batch.seq_id[index][0] = seq
        if seq != self._rows_seq:
            self._rows_seq, self._seq_rows = seq, count
        else:
            self._seq_rows = max(self._seq_rows, count)

    def fill(
        self,
        count: int,
        start: int,
        embeddings: np.ndarray | None = None,
        tokens: Sequence[int] = (),
        *,
        outputs: Sequence[int] | range,
        seq: int = 0,
    ) -> None:
        """Set the first ``count`` rows at positions from ``start`` of sequence ``seq``
        (``embeddings`` None: left as they are)."""
        self._set_sequence(count, seq)
        self.batch.n_tokens = count
        self.positions[:count] = np.arange(start, start + count)
        if embeddings is not None:
            self.embeddings[:count] = embeddings
        if len(tokens):
            self.tokens[:count] = tokens
        self.wants[:count] = 0
        self.wants[list(outputs)] = 1

    def free(self) -> None:
        """Free llama.cpp's arrays (the token ids, where ours, are not llama.cpp's)."""
        if self._token_ids is not None:
            self.batch.token = ctypes.POINTER(llama_cpp.llama_token)()
        llama_cpp.llama_batch_free(self.batch)


def layer_input_rows(
    target_context: Any,
    get_layer_input: Any,
    layer_ids: Sequence[int],
    count: int,
    width: int,
    first: int = 0,
) -> np.ndarray | None:
    """The inputs of the target's ``layer_ids`` for ``count`` rows of the batch it just
    decoded, from row ``first`` (llama.cpp hands them out in the batch's order),
    concatenated per row (a copy); None where llama.cpp handed none out."""
    layers = []
    for layer in layer_ids:
        pointer = get_layer_input(target_context, layer)
        if not pointer:
            return None
        layers.append(np.ctypeslib.as_array(pointer, shape=(first + count, width))[first:])
    return np.concatenate(layers, axis=1)


class LlamaCppHead:
    """A head's context beside the target's, its cache's bookkeeping, and its decodes.

    ``weights`` are freed here with ``owns_weights``. ``ENTRY_LAG``: how far before a
    position's target row the head's entry for it sits (EAGLE-3's entry ``p`` reads the
    token at ``p + 1``), so a rollback to ``n_keep`` drops entries from
    ``n_keep - ENTRY_LAG`` on.
    """

    WHAT = "the draft head"  # for messages
    ENTRY_LAG = 0
    CHAINS = False  # drafts on its own hidden states (an MTP or EAGLE-3 head)
    # Target rows kept behind the head's entries (TargetRows.keep_behind): a head whose
    # entry reads the row before its position needs the row before a rollback's cut.
    KEEP_BEHIND = 0

    def __init__(
        self,
        target_context: Any,
        weights: Any,
        *,
        row_width: int,
        n_ctx: int,
        n_batch: int,
        threads: int,
        n_vocab: int,
        owns_weights: bool,
        context_type: int | None = None,
        n_seq: int = 1,
        one_cache: bool = True,
    ) -> None:
        self._weights = weights
        self._owns_weights = owns_weights
        self._target_context = target_context
        self.n_vocab = n_vocab
        params = llama_cpp.llama_context_default_params()
        # A target of several sequences (``n_seq``): one head context holds one head
        # sequence per target sequence, in one cache (the head's rows need not round
        # like anything else's: they are drafts), with the weights read once; or, with
        # ``one_cache`` False, a stream each, as the target's context keeps them (a head
        # that reads the target's cache, Gemma 4's assistant, must lay it out alike:
        # llama.cpp shares the target's cells with it).
        params.n_ctx = n_ctx * n_seq
        params.n_batch = n_batch
        params.n_ubatch = n_batch  # encoders and block attention read a batch in one ubatch
        params.n_seq_max = n_seq
        params.kv_unified = n_seq > 1 and one_cache
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        if context_type is not None:
            params.n_rs_seq = 0
            params.ctx_type = context_type
        # A head borrows the target's token embeddings and LM head where it has none.
        params.ctx_other = target_context
        self._context = llama_cpp.llama_init_from_model(weights, params)
        if not self._context:
            if owns_weights:
                llama_cpp.llama_model_free(weights)
            self._weights = None
            raise ModelLoadError(f"llama.cpp could not create a context for {self.WHAT}")
        self._memory = llama_cpp.llama_get_memory(self._context)
        self.n_batch = min(
            int(llama_cpp.llama_n_batch(self._context)),
            int(llama_cpp.llama_n_ubatch(self._context)),
        )
        self._batches: list[HeadBatch] = []
        self.seq = 0  # the head's sequence in its context (its target sequence's)
        self._is_view = False  # a view of another head's context (for_sequence)
        self._kept = TargetRows(row_width, keep_behind=self.KEEP_BEHIND)
        self.synced = 0  # the head's cache holds the target's entries before this position
        self._chain_end = 0  # the position after the last drafting entry
        self._last_output = 0  # the batch index of the last decode's (last) output row
        # A view of the logits, kept while llama.cpp's buffer stays where it is (making
        # one costs ~90 us; see LlamaCppModel._logits_view).
        self._logits_address = 0
        self._logits_view = np.empty((0, n_vocab), dtype=np.float32)
        # The last output row's hidden state, kept by heads of a shared context: another
        # sequence's head may decode between a chain's steps.
        self._hidden: np.ndarray | None = None
        self.decodes = 0  # for tests and measurements

    def for_sequence(self, seq: int) -> LlamaCppHead:
        """This head for sequence ``seq`` of its target's parallel context: the same
        weights, context and batches, with its own cache entries (sequence ``seq`` of
        the head's context) and bookkeeping. Every call on either runs on the runtime
        thread, one at a time; a view's rows are copies (the next decode, perhaps
        another sequence's, reuses llama.cpp's buffers). Freed with this head."""
        view = type(self).__new__(type(self))
        view.__dict__.update(self.__dict__)
        view.seq = seq
        view._is_view = True
        view._owns_weights = False
        view._kept = TargetRows(self._kept.rows.shape[1], keep_behind=self.KEEP_BEHIND)
        view.synced = view._chain_end = view._last_output = 0
        view._logits_address = 0
        view._logits_view = self._logits_view[:0]
        view.decodes = 0
        if self.CHAINS:
            view._hidden = np.zeros(self._hidden_width(), dtype=np.float32)
        return view

    def _hidden_width(self) -> int:
        """The width of the hidden state a chain step reads (heads that chain)."""
        return int(llama_cpp.llama_model_n_embd(self._weights))

    def _new_batch(self, width: int, *, with_tokens: bool) -> HeadBatch:
        batch = HeadBatch(self.n_batch, width, with_tokens=with_tokens)
        self._batches.append(batch)
        return batch

    # -- following the target --------------------------------------------------------

    def target_rolled_back(self, n_keep: int) -> None:
        """The target forgot positions from ``n_keep`` on: so does the head."""
        self._kept.cut(n_keep)
        self._forget_from(max(0, n_keep - self.ENTRY_LAG))

    def _forget_from(self, position: int) -> None:
        """Drop the head's entries from ``position`` on (and any drafting ones)."""
        if self.synced > position or self._chain_end > self.synced:
            llama_cpp.llama_memory_seq_rm(self._memory, self.seq, min(self.synced, position), -1)
            self.synced = min(self.synced, position)
        self._chain_end = self.synced

    def _keep_layer_inputs(self, start: int, tokens: Sequence[int], first_row: int) -> bool:
        """Keep the target's inputs of the head's layers (``layer_ids``, each
        ``target_embd`` wide: EAGLE-3 and DFlash heads) for ``tokens``, evaluated at
        positions from ``start``, rows from ``first_row`` of the target's batch (a
        parallel context's holds other sequences' too); False where none were handed out."""
        layer_ids: Sequence[int] = self.layer_ids  # type: ignore[attr-defined]
        width: int = self.target_embd  # type: ignore[attr-defined]
        rows = layer_input_rows(
            self._target_context, get_layer_input, layer_ids, len(tokens), width, first_row
        )
        if rows is None:
            return False
        self._kept.add(start, tokens, rows)
        return True

    def _readable_from(self, first: int) -> int:
        """``first``, the first position the head can read next; where it lies past the
        head's entries (their rows are gone: a state restored whole, a rollback deeper
        than the rows kept behind), the head starts afresh, since llama.cpp's cache
        takes only positions that continue it: it then sees less context, which costs
        acceptance, never correctness."""
        if first > self.synced and self.synced > 0:
            self._forget_from(0)
        return first

    # -- drafting ---------------------------------------------------------------------

    def finish(self) -> None:
        """Drop the drafting entries (a chain on the head's own states, or a block)."""
        if self._chain_end > self.synced:
            llama_cpp.llama_memory_seq_rm(self._memory, self.seq, self.synced, -1)
        self._chain_end = self.synced

    def close(self) -> None:
        """Free the batches, the context and (where owned) the head's weights (a view's
        are its head's, freed there)."""
        if self._is_view:
            return
        for batch in self._batches:
            batch.free()
        self._batches.clear()
        if self._context:
            llama_cpp.llama_free(self._context)
            self._context = None
        if self._owns_weights and self._weights:
            llama_cpp.llama_model_free(self._weights)
            self._weights = None

    # -- internals ------------------------------------------------------------------

    def _chain_step(self, batch: HeadBatch, token: int) -> HostRows:
        """Chain ``token`` on the head's own hidden state at the last output row."""
        hidden = batch.embeddings
        if self._hidden is not None:
            hidden[0] = self._hidden
        else:
            # Copied straight into the batch (no numpy view of llama.cpp's buffer).
            ctypes.memmove(hidden.ctypes.data, self._last_hidden(), hidden.strides[0])
        batch.fill(1, self._chain_end, tokens=[token], outputs=[0], seq=self.seq)
        rows = self._run(batch, 1)
        self._chain_end += 1
        return rows

    def _run(
        self, batch: HeadBatch, outputs: int, *, encode: bool = False, what: str | None = None
    ) -> HostRows:
        """Decode (or encode) ``batch``; its last ``outputs`` rows' logits (a view valid
        until the next run; none for 0)."""
        note_decoding_thread()
        run = llama_cpp.llama_encode if encode else llama_cpp.llama_decode
        status = run(self._context, batch.batch)
        if not encode:
            self.decodes += 1
        if status != 0:
            raise DecodeError(
                f"llama.cpp could not run {what or self.WHAT} (status {status}: "
                f"{last_llama_error()})"
            )
        self._last_output = int(batch.batch.n_tokens) - 1
        # (A decode that only catches the head's cache up outputs no row to chain on.)
        if self._hidden is not None and not encode and batch.wants[self._last_output]:
            ctypes.memmove(self._hidden.ctypes.data, self._last_hidden(), self._hidden.nbytes)
        if outputs == 0 or encode:
            return HostRows(self._logits_view[:0])
        pointer = llama_cpp.llama_get_logits(self._context)
        address = ctypes.addressof(pointer.contents)
        if address != self._logits_address or outputs > self._logits_view.shape[0]:
            self._logits_view = np.ctypeslib.as_array(pointer, shape=(outputs, self.n_vocab))
            self._logits_address = address
        if self._is_view:
            return HostRows(self._logits_view[:outputs].copy())
        return HostRows(self._logits_view[:outputs])

    def _last_hidden(self) -> Any:
        """A pointer to the head's own hidden state at the last decode's output row."""
        pointer = llama_cpp_ext.llama_get_embeddings_nextn_ith(self._context, self._last_output)
        if not pointer:
            raise DecodeError(f"llama.cpp gave no hidden state for {self.WHAT} to chain on")
        return pointer
