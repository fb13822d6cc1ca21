"""The llama.cpp runtime, through llama-cpp-python's low-level (ctypes) API.

Why not ``llama_cpp.Llama``: its high-level generate keeps an n_ctx x n_vocab score
array (2.5 GB at a 4k context with a 150k vocabulary) and its draft-model path
breaks when n_ctx > n_batch. Here each context owns one ``llama_batch``;
``forward`` evaluates all new tokens in ONE ``llama_decode`` and hands back the
logits rows as a zero-copy numpy view of llama.cpp's own buffer, asking for logits
only where the caller needs them (never for a prefilled prompt).

This is the only module that imports ``llama_cpp``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from backends.base import ChatMessage, SequenceState, ToolSpec, VocabInfo
from backends.chat_template import render_with_model_tokens
from backends.errors import (
    ContextOverflowError,
    DecodeError,
    ModelLoadError,
    RuntimeUnavailableError,
)

try:
    import llama_cpp
except ImportError as error:  # pragma: no cover - exercised where llama_cpp is absent
    raise RuntimeUnavailableError(
        "llama-cpp-python is not installed. Run packaging/install.sh, or "
        "`pip install llama-cpp-python` in draftpen's environment."
    ) from error

# After the runtime's own import, so that a missing runtime says how to install it.
from backends.llamacpp_mtp import LlamaCppMtpHead
from backends.llamacpp_rollback import (
    DEFAULT_SNAPSHOTS,
    RecurrentRollback,
    flush_replay,
    holds_recurrent_state,
)

GGUF_MAGIC = b"GGUF"
VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
_GGML_LOG_LEVELS_KEPT = (2, 3)  # warnings and errors
_GGML_LOG_LEVEL_CONT = 5  # continues the previous message
GGML_TYPE_BF16 = 30  # ggml.h; llama_cpp does not export this one

_backend_lock = threading.Lock()
_backend_ready = False
_recent_errors: deque[str] = deque(maxlen=20)
_last_level = 0


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp is chatty on stderr; keep warnings and errors so a failed load can
    # say why, and print nothing (the TUI owns the terminal).
    global _last_level
    if level != _GGML_LOG_LEVEL_CONT:
        _last_level = level
    if _last_level in _GGML_LOG_LEVELS_KEPT:
        _recent_errors.append(text.decode("utf-8", errors="replace").strip())


def _ensure_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True


def _last_llama_error() -> str:
    messages = [m for m in _recent_errors if m]
    return messages[-1] if messages else "no details from llama.cpp"


def physical_cores() -> int:
    """Physical CPU cores (llama.cpp's own default is half the logical ones)."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False)
    except ImportError:  # pragma: no cover - psutil is a dependency
        cores = None
    return max(1, cores or os.cpu_count() or 1)


def supports_gpu_offload() -> bool:
    """Whether this llama.cpp build can put layers on a GPU (CUDA, Metal, ...)."""
    _ensure_backend()
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> str:
    """llama.cpp's own list of what this build uses: ``CPU : AVX2 = 1 | AMX_INT8 = 1 | ...``.

    ggml lists the instruction sets it was compiled for, so this is the build's side of
    "does this CPU have it / does the runtime use it" (``draftpen doctor``)."""
    _ensure_backend()
    return bytes(llama_cpp.llama_print_system_info()).decode("utf-8", errors="replace").strip()


def check_gguf_file(path: Path) -> None:
    """Fail early, with a useful message, on a missing or non-GGUF file."""
    if not path.is_file():
        raise ModelLoadError(f"Model file not found: {path}")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF model file (it starts with {magic!r}). "
            "Delete it and download the model again."
        )


def _uint8_pointer(buffer: np.ndarray) -> Any:
    """A ``uint8_t *`` to a contiguous numpy byte buffer, for llama.cpp's state calls."""
    return buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def _vocab_token_text(vocab: Any, token: int) -> str:
    """A vocabulary's stored text for a token (shared by the model and the vocab-only load)."""
    raw = llama_cpp.llama_vocab_get_text(vocab, token)
    return raw.decode("utf-8", errors="replace") if raw else ""


def _vocab_facts(vocab: Any, n_vocab: int) -> VocabInfo:
    """The tokenizer facts the pair check compares."""
    return VocabInfo(
        vocab_type=VOCAB_TYPES.get(int(llama_cpp.llama_vocab_type(vocab)), "unknown"),
        n_vocab=n_vocab,
        bos_id=int(llama_cpp.llama_vocab_bos(vocab)),
        eos_id=int(llama_cpp.llama_vocab_eos(vocab)),
        add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
    )


class LlamaCppModel:
    """A GGUF model with one context, one sequence and one reusable batch."""

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
    ) -> None:
        self.path = Path(path)
        check_gguf_file(self.path)
        _ensure_backend()
        self.name = name or self.path.stem
        self._model = None
        self._context = None
        self._batch = None
        self._mtp: LlamaCppMtpHead | None = None

        model_params = llama_cpp.llama_model_default_params()
        self.gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
        if gpu_layers is None:
            gpu_layers = 999 if self.gpu_offload else 0
        model_params.n_gpu_layers = gpu_layers
        # The multi-token-prediction layers, where the file has them (one block): the
        # "mtp" drafter runs them (backends/llamacpp_mtp.py).
        model_params.load_mtp = load_mtp
        # With exact kernels, verify batches of up to 7 tokens compute logits bit for bit
        # like one-token decoding (measured on our 2-core AVX-512 machine with the starter
        # target, Q4_K_M); with llama.cpp's defaults no batch does past 512 tokens of
        # context. Part one: no weight repacking. Repacked CPU weights have batched
        # kernels of their own: from 4 tokens on they differed by up to 0.5 in a logit.
        # Reading the weights into memory (no mmap) kept plain decoding within 2% of the
        # repacked speed; memory-mapped it was 6% slower. (From 8 tokens on, llama.cpp's
        # tiled K-quant matmul rounds differently; it cannot be turned off per model.)
        self.exact_kernels = exact_kernels
        if exact_kernels:
            model_params.use_extra_bufts = False
            model_params.use_mmap = False
        _recent_errors.clear()
        self._model = llama_cpp.llama_model_load_from_file(
            str(self.path).encode("utf-8"), model_params
        )
        if not self._model:
            raise ModelLoadError(
                f"llama.cpp could not load {self.path} ({_last_llama_error()}). The file may "
                "be truncated or corrupt: delete it and download it again."
            )
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.size_bytes = int(llama_cpp.llama_model_size(self._model))
        # A recurrent state (hybrid Qwen3.5/3.6, Mamba, ...) cannot be cut back like a KV
        # cache: see backends/llamacpp_rollback.py.
        self.recurrent = holds_recurrent_state(self._model)
        self.mtp_layers = int(llama_cpp.llama_model_n_layer_nextn(self._model)) if load_mtp else 0

        threads = n_threads or physical_cores()
        context_params = llama_cpp.llama_context_default_params()
        context_params.n_ctx = n_ctx
        context_params.n_batch = n_batch
        context_params.n_ubatch = n_batch
        context_params.n_seq_max = 1
        if self.recurrent:
            context_params.n_rs_seq = (
                DEFAULT_SNAPSHOTS if rollback_snapshots is None else rollback_snapshots
            )
        context_params.n_threads = threads
        context_params.n_threads_batch = threads
        context_params.no_perf = True
        if exact_kernels and gpu_layers == 0:
            # Part two: a BF16 V cache, so one-token decoding and verify batches take the
            # same attention kernel at every context length. With F16 K and V, a
            # one-token decode splits the cache across threads once its view reaches 512
            # cells and merges partial softmaxes, while a batch takes the one-pass kernel:
            # from 300 tokens of context even a batch of 2 differed by 0.45 in a logit.
            # The split needs K and V of the same 16-bit type. The price, measured here:
            # decoding 0.92-1.07x the F16 time per token at 200-2400 tokens of context,
            # but reading a prompt is slower (no tiled attention either): 512 tokens
            # 8.8 s against 6.8 s, 2048 tokens 68.5 s against 29.0 s.
            context_params.type_v = GGML_TYPE_BF16
        # Flash attention stays at llama.cpp's default (auto, on for the CPU): without it
        # the first row of a verify batch differs from a single-token decode (measured:
        # 0.89 in the logits on SmolLM2), which makes greedy speculation flip tokens.
        self._context = llama_cpp.llama_init_from_model(self._model, context_params)
        if not self._context:
            self.close()
            raise ModelLoadError(
                f"llama.cpp could not create a {n_ctx}-token context for {self.path} "
                f"({_last_llama_error()}). Try a smaller context length."
            )
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._context))
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

    # -- metadata and tokens -------------------------------------------------

    def _metadata(self, key: str) -> str | None:
        size = 1 << 16
        while True:
            buffer = ctypes.create_string_buffer(size)
            length = llama_cpp.llama_model_meta_val_str(
                self._model, key.encode("utf-8"), buffer, size
            )
            if length < 0:
                return None
            if length < size:
                return buffer.value.decode("utf-8", errors="replace")
            size = length + 1

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens whose positions the KV cache holds."""
        return self._tokens

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Text to tokens; special-token text is parsed as special tokens."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buffer = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buffer, capacity, add_special, True
            )
            if count >= 0:
                return list(buffer[:count])
            capacity = -count

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token; control tokens render as nothing."""
        piece = self._piece_cache.get(token)
        if piece is None:
            buffer = ctypes.create_string_buffer(64)
            length = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 64, 0, False)
            if length < 0:
                buffer = ctypes.create_string_buffer(-length)
                length = llama_cpp.llama_token_to_piece(
                    self._vocab, token, buffer, -length, 0, False
                )
            piece = buffer.raw[:length]
            self._piece_cache[token] = piece
        return piece

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text for a token."""
        return _vocab_token_text(self._vocab, token)

    def is_end_of_generation(self, token: int) -> bool:
        """EOS, EOT or any other token llama.cpp marks as ending generation."""
        known = self._eog_cache.get(token)
        if known is None:
            known = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
            self._eog_cache[token] = known
        return known

    def vocab_info(self) -> VocabInfo:
        """Tokenizer facts for the pair check."""
        return _vocab_facts(self._vocab, self.n_vocab)

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        template_variables: Mapping[str, Any] | None = None,
    ) -> str:
        """Render the conversation with the template stored in the GGUF file."""
        return render_with_model_tokens(
            self, self.chat_template, messages, tools=tools, template_variables=template_variables
        )

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
        status = llama_cpp.llama_decode(self._context, batch)
        if status != 0:
            if status == 1:
                raise ContextOverflowError(
                    "llama.cpp found no room in the KV cache. Start a new chat or raise "
                    "the context length."
                )
            raise DecodeError(f"llama_decode failed with status {status}: {_last_llama_error()}")
        if self._mtp is not None:
            self._mtp.target_decoded(start, tokens)

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
        elif not llama_cpp.llama_memory_seq_rm(self._memory, 0, n_keep, -1):
            raise DecodeError(f"llama.cpp could not drop cached positions from {n_keep} on")
        del self._tokens[n_keep:]
        if self._mtp is not None:
            self._mtp.target_rolled_back(n_keep)

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
        size = int(llama_cpp.llama_state_seq_get_size(context, 0))
        # np.empty, not a ctypes array: no zero-filling of a buffer about to be written.
        buffer = np.empty(size, dtype=np.uint8)
        written = llama_cpp.llama_state_seq_get_data(context, _uint8_pointer(buffer), size, 0)
        if written != size:
            raise DecodeError(
                f"llama.cpp copied {written} of {size} bytes of {self.name}'s cache "
                f"({_last_llama_error()})"
            )
        return SequenceState(tuple(self._tokens), buffer.nbytes, buffer, owner=self)

    def restore_state(self, state: SequenceState) -> None:
        """Put a state saved by this model back into the cache, replacing what it holds."""
        if state.owner is not self:
            raise ValueError(f"this state was saved by another model, not {self.name}")
        context = self._live_context()
        buffer = state.payload
        _recent_errors.clear()
        if self._mtp is not None:
            self._mtp.target_rolled_back(0)  # it has no hidden states for a restored cache
        read = llama_cpp.llama_state_seq_set_data(context, _uint8_pointer(buffer), buffer.size, 0)
        restored_end = int(llama_cpp.llama_memory_seq_pos_max(self._memory, 0)) + 1
        if read != buffer.size or restored_end != len(state.tokens):
            # llama.cpp drops the sequence when a restore fails part way; make sure of
            # it, so the cache and ``_tokens`` agree (empty) rather than half-restored.
            llama_cpp.llama_memory_seq_rm(self._memory, 0, 0, -1)
            self._tokens.clear()
            if self._recurrent is not None:
                self._recurrent.reset(0)
            raise DecodeError(
                f"llama.cpp could not restore {self.name}'s cache ({_last_llama_error()}); "
                "the prompt will be read again"
            )
        self._tokens = list(state.tokens)
        if self._recurrent is not None:
            self._recurrent.reset(len(self._tokens))

    def _live_context(self) -> Any:
        if not self._context:
            raise DecodeError(f"{self.name} was closed; load the model again to use it")
        return self._context

    def mtp_head(self) -> LlamaCppMtpHead | None:
        """The model's own multi-token-prediction head (None: the file has none)."""
        if self._mtp is None and self.mtp_layers > 0:
            self._mtp = self._new_mtp_head(self._model)
        return self._mtp

    def attach_mtp_file(self, path: str | Path) -> LlamaCppMtpHead:
        """Draft with the MTP head in a separate GGUF (as some publishers ship it)."""
        check_gguf_file(Path(path))
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 999 if self.gpu_offload else 0
        params.load_mtp = True
        weights = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if not weights:
            raise ModelLoadError(f"llama.cpp could not load the MTP head {path}")
        if llama_cpp.llama_model_n_layer_nextn(weights) <= 0 or llama_cpp.llama_model_n_embd(
            weights
        ) != llama_cpp.llama_model_n_embd(self._model):
            llama_cpp.llama_model_free(weights)
            raise ModelLoadError(f"{path} holds no MTP head for {self.name}")
        if self._mtp is not None:
            self._mtp.close()
        self._mtp = self._new_mtp_head(weights, owns_weights=True)
        return self._mtp

    def _new_mtp_head(self, weights: Any, *, owns_weights: bool = False) -> LlamaCppMtpHead:
        return LlamaCppMtpHead(
            self._live_context(),
            weights,
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            threads=self.n_threads,
            n_vocab=self.n_vocab,
            owns_weights=owns_weights,
        )

    def close(self) -> None:
        """Free the MTP head, the batch, the context and the weights."""
        if self._mtp is not None:
            self._mtp.close()
            self._mtp = None
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._context:
            llama_cpp.llama_free(self._context)
            self._context = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        # At interpreter shutdown llama_cpp may already be torn down.
        with contextlib.suppress(Exception):
            self.close()


class LlamaCppVocabulary:
    """A GGUF file's tokenizer alone: llama.cpp's vocab-only load, no weights, no context.

    Enough for the pair check right after a download, in a fraction of a second even for
    a large model.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        check_gguf_file(self.path)
        _ensure_backend()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        _recent_errors.clear()
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode("utf-8"), params)
        if not self._model:
            raise ModelLoadError(
                f"llama.cpp could not read the tokenizer of {self.path} ({_last_llama_error()}). "
                "The file may be truncated or corrupt: delete it and download it again."
            )
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text for a token."""
        return _vocab_token_text(self._vocab, token)

    def vocab_info(self) -> VocabInfo:
        """Tokenizer facts for the pair check."""
        return _vocab_facts(self._vocab, self.n_vocab)

    def close(self) -> None:
        """Free the vocabulary."""
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class LlamaCppReference:
    """llama-cpp-python's own high-level decoding, as an outside yardstick for bench.

    ``prompt_lookup`` turns on its ``LlamaPromptLookupDecoding`` (n-gram drafting);
    without it this is its plain streaming completion. Greedy, same threads as ours.
    Its draft path keeps logits for the whole context, so n_batch = n_ctx here.
    """

    def __init__(self, path: str | Path, *, n_ctx: int = 2048, prompt_lookup: bool = False):
        _ensure_backend()
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        threads = physical_cores()
        self.name = "llama-cpp-python prompt lookup" if prompt_lookup else "llama-cpp-python"
        self._llama = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=n_ctx if prompt_lookup else 512,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=-1 if supports_gpu_offload() else 0,
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10) if prompt_lookup else None,
            verbose=False,
        )
        # Llama() installs its own log callback; keep llama.cpp quiet for the TUI.
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))

    def decode_speed(self, prompt_tokens: Sequence[int], max_tokens: int) -> tuple[int, float]:
        """Stream a greedy completion; return (tokens, seconds from first to last token).

        The first token's time includes prefill, so speed is measured over the rest.
        """
        self._llama.reset()
        first = last = None
        count = 0
        for _chunk in self._llama.create_completion(
            list(prompt_tokens), max_tokens=max_tokens, temperature=0.0, stream=True
        ):
            now = time.perf_counter()
            count += 1
            if first is None:
                first = now
            last = now
        if first is None or last is None or count < 2:
            return count, 0.0
        return count - 1, last - first

    def close(self) -> None:
        """Free the model."""
        self._llama.close()
