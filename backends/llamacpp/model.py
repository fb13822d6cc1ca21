"""The llama.cpp runtime, through llama-cpp-python's low-level (ctypes) API.

Why not ``llama_cpp.Llama``: its high-level generate keeps an n_ctx x n_vocab score
array (2.5 GB at a 4k context with a 150k vocabulary) and its draft-model path
breaks when n_ctx > n_batch. Here each context owns one ``llama_batch``;
``forward`` evaluates all new tokens in ONE ``llama_decode`` and hands back the
logits rows as a zero-copy numpy view of llama.cpp's own buffer, asking for logits
only where the caller needs them (never for a prefilled prompt).

This module holds ``LlamaCppModel`` (loading, evaluation, rollback, saved states); the
modules beside it in ``backends/llamacpp/`` hold its parts, and they alone import
``llama_cpp``: the library and its log (``library``), load settings (``params``), the
tokenizer (``vocab``), recurrent rollback (``rollback``), the draft heads a target
feeds (``draft_heads``: its MTP head, ``mtp``, an EAGLE-3 head, ``eagle3``, or a
DFlash/DSpark head, ``dflash``, on their shared ``head_base``) and
bench's yardstick (``reference``).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from backends.base import SequenceState
from backends.errors import ContextOverflowError, DecodeError, ModelLoadError
from backends.llamacpp.draft_heads import DraftHeads
from backends.llamacpp.ggml_devices import decode, release_workers, supports_gpu_offload
from backends.llamacpp.head_base import LlamaCppHead

# The runtime's own import (each module of this package makes it before any other
# of llama_cpp), so that a missing runtime says how to install it.
from backends.llamacpp.library import (
    check_gguf_file,
    ensure_backend,
    last_llama_error,
    llama_cpp,
    physical_cores,
    recent_errors,
)
from backends.llamacpp.params import context_params, model_params, parallel_refusal
from backends.llamacpp.placement import load_weights, placement_for
from backends.llamacpp.rollback import (
    DEFAULT_SNAPSHOTS,
    RecurrentRollback,
    flush_replay,
    holds_recurrent_state,
)
from backends.llamacpp.state_files import read_payload, state_identity, write_payload
from backends.llamacpp.tree_batch import TreeDecoding, tree_sequences
from backends.llamacpp.vocab import LlamaCppTokens
from backends.workers.endpoints import Endpoint
from backends.workers.wire import WorkerInfo


def _uint8_pointer(buffer: np.ndarray) -> Any:
    """A ``uint8_t *`` to a contiguous numpy byte buffer, for llama.cpp's state calls."""
    return buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


class LlamaCppModel(TreeDecoding, DraftHeads, LlamaCppTokens):
    """A GGUF model with one context and one reusable batch.

    With ``parallel`` N > 1 the context holds N sequences of ``n_ctx`` cells; this object
    then loads and measures, and N views generate (``backends/llamacpp/sequences.py``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
        gpu_layers: int | None = None,
        name: str | None = None,
        exact_kernels: bool = False,
        rollback_snapshots: int | None = None,
        load_mtp: bool = True,
        parallel: int = 1,
        workers: Sequence[WorkerInfo] = (),
        worker_split: Sequence[float] | None = None,
    ) -> None:
        self.path = Path(path)
        check_gguf_file(self.path)
        ensure_backend()
        self.name = name or self.path.stem
        self._model = None
        self._context = None
        self._batch = None
        self._head: LlamaCppHead | None = None
        self._workers: tuple[Endpoint, ...] = ()
        # This model's sequence in its context; the views of a parallel context
        # (backends/llamacpp/sequences.py) each have their own.
        self._seq = 0
        self._state_owner: object = self

        self.gpu_offload = supports_gpu_offload()
        if gpu_layers is None:
            gpu_layers = 999 if self.gpu_offload else 0
        self.exact_kernels = exact_kernels
        self.gpu_layers = gpu_layers
        self.bf16_v_cache = exact_kernels and gpu_layers == 0
        # With workers, the target's layers are split over them and this machine.
        placement = placement_for(self.path, gpu_layers, workers, worker_split)
        self.placement = placement.where
        params = model_params(placement=placement, load_mtp=load_mtp, exact_kernels=exact_kernels)
        self._model = load_weights(self.path, placement, params)
        self._workers = placement.workers  # held (see load_weights) until close()
        self.splits_over_workers = bool(self._workers)  # its forwards wait on the network
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.size_bytes = int(llama_cpp.llama_model_size(self._model))
        # A recurrent state (hybrid Qwen3.5/3.6, Mamba, ...) cannot be cut back like a KV
        # cache: see backends/llamacpp/rollback.py.
        self.recurrent = holds_recurrent_state(self._model)
        self.mtp_layers = int(llama_cpp.llama_model_n_layer_nextn(self._model)) if load_mtp else 0

        # A recurrent state is rolled back per sequence by replay: such a model's
        # sequences run one at a time (see parallel_refusal).
        self.parallel_refusal = parallel_refusal(self.recurrent, parallel)
        self.parallel = 1 if self.parallel_refusal else max(1, parallel)
        threads = n_threads or physical_cores()
        snapshots = DEFAULT_SNAPSHOTS if rollback_snapshots is None else rollback_snapshots
        # Scratch sequence ids for draft trees (tree_batch.py), in the one KV stream a
        # lone sequence keeps in position order anyway.
        self._tree_seqs = tree_sequences(self.recurrent, self.parallel)
        # One KV cache for all sequences, or a stream each (see context_params).
        self.one_cache = not exact_kernels or self.parallel == 1
        settings = context_params(
            n_ctx=n_ctx * self.parallel,
            n_seq=self.parallel + self._tree_seqs,
            one_cache=self.one_cache,
            n_batch=n_batch,
            threads=threads,
            recurrent_snapshots=snapshots if self.recurrent else None,
            bf16_v_cache=self.bf16_v_cache,
        )
        # Flash attention stays at llama.cpp's default (auto, on for the CPU): without it
        # the first row of a verify batch differs from a single-token decode (measured:
        # 0.89 in the logits on SmolLM2), which makes greedy speculation flip tokens.
        self._context = llama_cpp.llama_init_from_model(self._model, settings)
        if not self._context:
            self.close()
            raise ModelLoadError(
                f"llama.cpp could not create a {n_ctx}-token context for {self.path} "
                f"({last_llama_error()}). Try a smaller context length."
            )
        # The most one sequence may hold (a parallel context holds n_ctx per sequence).
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._context)) // self.parallel
        # llama.cpp may round the context up and clamp the batch to it; use its values.
        self.n_batch = min(
            int(llama_cpp.llama_n_batch(self._context)),
            int(llama_cpp.llama_n_ubatch(self._context)),
        )
        self.n_threads = threads
        self._memory = llama_cpp.llama_get_memory(self._context)
        self._recurrent = (
            RecurrentRollback(self._context, self._memory, name=self.name)
            if self.recurrent
            else None
        )
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        # numpy views of the batch's arrays, made once: filling a batch is then a few
        # array assignments, not five ctypes stores per token. Every token belongs to
        # sequence 0 alone, so those fields are set here for good.
        batch = self._batch
        self._batch_tokens = np.ctypeslib.as_array(batch.token, shape=(self.n_batch,))
        self._batch_positions = np.ctypeslib.as_array(batch.pos, shape=(self.n_batch,))
        self._batch_wants_logits = np.ctypeslib.as_array(batch.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(batch.n_seq_id, shape=(self.n_batch,))[:] = 1
        for index in range(self.n_batch):
            batch.seq_id[index][0] = 0
        self._offsets = np.arange(self.n_batch, dtype=self._batch_positions.dtype)
        # The logits buffer's address and a view of it (see _logits_view).
        self._logits_address = 0
        self._logits_rows = np.empty((0, self.n_vocab), dtype=np.float32)
        self._tokens: list[int] = []
        self._piece_cache: dict[int, bytes] = {}
        self._eog_cache: dict[int, bool] = {}
        self.chat_template = self._metadata("tokenizer.chat_template")

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens whose positions the KV cache holds."""
        return self._tokens

    # -- evaluation ----------------------------------------------------------

    def _decode(self, tokens: Sequence[int], logits_from: int) -> None:
        """Append ``tokens`` in one ``llama_decode``; logits for positions >= ``logits_from``.

        With a recurrent state, tokens a rollback left to replay lead the batch.
        """
        start = len(self._tokens)
        recurrent = self._recurrent
        replayed = 0
        if recurrent is not None:
            replay = recurrent.replay(self._tokens)
            merged = len(replay) + len(tokens)
            # Replayed tokens ride in front of the batch, unless the batch has no room
            # or needs a checkpoint before it: that must stand after the replay, or the
            # next rollback would replay them again.
            if replay and (
                merged > self.n_batch or recurrent.needs_checkpoint(merged, logits_from < merged)
            ):
                flush_replay(recurrent, self._tokens, self._decode_at, self.n_batch)
            elif replay:
                replayed = len(replay)
                tokens, logits_from, start = (
                    [*replay, *tokens],
                    logits_from + replayed,
                    start - replayed,
                )
            recurrent.before_decode(len(tokens), logits_from < len(tokens))
        self._decode_at(tokens, start, logits_from)
        if recurrent is None:
            self._tokens.extend(tokens)
        else:
            self._tokens.extend(tokens[replayed:])
            recurrent.decoded(len(tokens), replayed)

    def _decode_at(self, tokens: Sequence[int], start: int, logits_from: int) -> None:
        """One ``llama_decode`` of ``tokens`` at positions from ``start`` on."""
        if not self._context:
            # Decoding with a freed context would crash the process, not raise.
            raise DecodeError(f"{self.name} was closed; load the model again to use it")
        count = len(tokens)
        if count > self.n_batch:
            raise ValueError(f"{count} tokens exceed the batch size {self.n_batch}")
        if start + count > self.n_ctx:
            raise ContextOverflowError(
                f"The conversation needs {start + count} tokens but the context holds "
                f"{self.n_ctx}. Start a new chat or raise the context length."
            )
        batch = self._batch
        batch.n_tokens = count
        self._batch_tokens[:count] = tokens
        np.add(self._offsets[:count], start, out=self._batch_positions[:count])
        wants_logits = self._batch_wants_logits
        wants_logits[:logits_from] = 0
        wants_logits[logits_from:count] = 1
        status = decode(self._context, batch, count)
        if status != 0:
            if status == 1:
                raise ContextOverflowError(
                    "llama.cpp found no room in the KV cache. Start a new chat or raise "
                    "the context length."
                )
            raise DecodeError(f"llama_decode failed with status {status}: {last_llama_error()}")
        if self._head is not None:
            self._head.target_decoded(start, tokens)

    def _logits_view(self, rows: int) -> np.ndarray:
        """The first ``rows`` rows of llama.cpp's logits buffer, as a numpy view.

        Making a view costs ~90 us (numpy builds ctypes array types for it), more than
        sampling a row, so one is kept and sliced while the buffer stays where it was;
        llama.cpp moves it only when a batch needs more output rows than it holds.
        """
        pointer = llama_cpp.llama_get_logits(self._context)
        address = ctypes.addressof(pointer.contents)
        if address != self._logits_address or rows > self._logits_rows.shape[0]:
            self._logits_rows = np.ctypeslib.as_array(pointer, shape=(rows, self.n_vocab))
            self._logits_address = address
        return self._logits_rows[:rows]

    def prefill(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens into the cache, batch by batch, with no logits at all."""
        for offset in range(0, len(tokens), self.n_batch):
            chunk = tokens[offset : offset + self.n_batch]
            self._decode(chunk, logits_from=len(chunk))
        if self._recurrent is not None:
            self._recurrent.prefilled(len(tokens))

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` and return their logits as a view valid until the next call."""
        count = len(tokens)
        if count == 0:
            raise ValueError("forward needs at least one token")
        if last_only:
            if count > self.n_batch:
                self.prefill(tokens[: count - 1])
                tokens = tokens[count - 1 :]
                count = 1
            self._decode(tokens, logits_from=count - 1)
            return self._logits_view(1)
        self._decode(tokens, logits_from=0)
        return self._logits_view(count)

    def rollback(self, n_keep: int) -> None:
        """Forget cached positions from ``n_keep`` on (any depth, for a recurrent state too)."""
        if n_keep >= len(self._tokens):
            return
        n_keep = max(0, n_keep)
        if self._recurrent is not None:
            self._recurrent.rollback(n_keep)
        elif not llama_cpp.llama_memory_seq_rm(self._memory, self._seq, n_keep, -1):
            raise DecodeError(f"llama.cpp could not drop cached positions from {n_keep} on")
        del self._tokens[n_keep:]
        if self._head is not None:
            self._head.target_rolled_back(n_keep)

    @property
    def rollback_limit(self) -> int | None:
        """The most positions a rollback right after a forward drops at no cost (llama.cpp's
        recurrent-state snapshots); the controller drafts no deeper. None: no limit (a KV
        cache; or a recurrent architecture without snapshots, which keeps a checkpoint
        before every verify instead)."""
        if self._recurrent is None or self._recurrent.snapshots == 0:
            return None
        return self._recurrent.snapshots

    def keep_rollback_point(self) -> None:
        """A later rollback will come back to the current end: keep what it needs.

        Nothing for a KV cache; a copy of the recurrent state otherwise (a draft model
        calls this before drafting a chain it will partly undo next round).
        """
        if self._recurrent is not None:
            flush_replay(self._recurrent, self._tokens, self._decode_at, self.n_batch)
            self._recurrent.keep_point()

    def reusable_prefix(self, shared: int) -> int:
        """How many of the first ``shared`` cached tokens a rollback to ``shared`` keeps
        without evaluating them again (all of them, but for a recurrent state)."""
        shared = min(shared, len(self._tokens))
        return shared if self._recurrent is None else self._recurrent.reusable_prefix(shared)

    # -- keeping conversations -----------------------------------------------

    def save_state(self) -> SequenceState:
        """Copy the sequence's KV cells into host memory (llama.cpp's per-sequence state).

        The copy holds the cells' positions, keys and values, not the logits: the loop
        never reads logits left from before a prefill, it evaluates the pending token.
        """
        context = self._live_context()
        if self._recurrent is not None:
            flush_replay(self._recurrent, self._tokens, self._decode_at, self.n_batch)
        seq = self._seq
        size = int(llama_cpp.llama_state_seq_get_size(context, seq))
        # np.empty, not a ctypes array: no zero-filling of a buffer about to be written.
        buffer = np.empty(size, dtype=np.uint8)
        written = llama_cpp.llama_state_seq_get_data(context, _uint8_pointer(buffer), size, seq)
        if written != size:
            raise DecodeError(
                f"llama.cpp copied {written} of {size} bytes of {self.name}'s cache "
                f"({last_llama_error()})"
            )
        return SequenceState(tuple(self._tokens), buffer.nbytes, buffer, owner=self._state_owner)

    def restore_state(self, state: SequenceState) -> None:
        """Put a state saved by this model back into the cache, replacing what it holds."""
        if state.owner is not self._state_owner:
            raise ValueError(f"this state was saved by another model, not {self.name}")
        context = self._live_context()
        buffer = state.payload
        recent_errors.clear()
        if self._head is not None:
            self._head.target_rolled_back(0)  # it has no hidden states for a restored cache
        seq = self._seq
        read = llama_cpp.llama_state_seq_set_data(context, _uint8_pointer(buffer), buffer.size, seq)
        restored_end = int(llama_cpp.llama_memory_seq_pos_max(self._memory, seq)) + 1
        if read != buffer.size or restored_end != len(state.tokens):
            # llama.cpp drops the sequence when a restore fails part way; make sure of
            # it, so the cache and ``_tokens`` agree (empty) rather than half-restored.
            llama_cpp.llama_memory_seq_rm(self._memory, seq, 0, -1)
            self._tokens.clear()
            if self._recurrent is not None:
                self._recurrent.reset(0)
            raise DecodeError(
                f"llama.cpp could not restore {self.name}'s cache ({last_llama_error()}); "
                "the prompt will be read again"
            )
        self._tokens = list(state.tokens)
        if self._recurrent is not None:
            self._recurrent.reset(len(self._tokens))

    def state_identity(self) -> Mapping[str, object]:
        """What a state saved by another process must match to be loaded here."""
        return state_identity(
            self.path,
            n_batch=self.n_batch,
            gpu_layers=self.gpu_layers,
            exact_kernels=self.exact_kernels,
            bf16_v_cache=self.bf16_v_cache,
            mtp_layers=self.mtp_layers,
        )

    def write_state(self, state: SequenceState, file: BinaryIO) -> None:
        """Write a saved state's bytes (touches only the copy, not the runtime)."""
        write_payload(state.payload, file)

    def read_state(self, tokens: Sequence[int], file: BinaryIO, nbytes: int) -> SequenceState:
        """A state written by ``write_state``, for ``restore_state``."""
        return SequenceState(
            tuple(tokens), nbytes, read_payload(file, nbytes), owner=self._state_owner
        )

    def close(self) -> None:
        """Free the draft head, the batch, the context and the weights."""
        self._close_head()
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._context:
            llama_cpp.llama_free(self._context)
            self._context = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None
            release_workers(self._workers)

    def __del__(self) -> None:
        # At interpreter shutdown llama_cpp may already be torn down.
        with contextlib.suppress(Exception):
            self.close()
