"""The MLX runtime, through mlx and mlx-lm (Metal on Apple Silicon; CPU on Linux for tests).

A model directory (or Hugging Face repo) in mlx-lm's format is loaded with mlx-lm's
loader; the KV cache is mlx-lm's prompt cache, and ``rollback`` trims it. Recurrent
layers (hybrid Qwen3.5/3.6's Gated DeltaNet) cannot be trimmed: a snapshot is restored
and the tokens past it replayed (backends/mlx/rollback.py). Sliding-window layers are
refused: the speculative loop must forget rejected draft positions.

MLX evaluates lazily, which gives a prefill without the output layer for free: the
prompt goes through the model, but only the cache's keys and values are evaluated, so
the vocabulary projection (the largest matmul for a 150k vocabulary) is never run.

Only the modules of this package import ``mlx`` and ``mlx_lm``: this one, device_rows.py
(sampling on the device), state_files.py (saved caches in files), and for several
sequences at once sequences.py, forward_batcher.py and batched_forward.py.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from backends.base import ChatMessage, SequenceState, ToolSpec, VocabInfo
from backends.errors import (
    ContextOverflowError,
    DecodeError,
    ModelLoadError,
    RuntimeUnavailableError,
)
from backends.mlx.rollback import cache_nbytes, cache_rollback, untrimmable_cache_reason
from backends.output.chat_template import render_with_model_tokens
from backends.sampling.rows import HostRows, LogitRows

# mlx-lm imports transformers, which prints a PyTorch advisory on stderr; the TUI owns
# the terminal, and MLX needs no PyTorch.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

try:
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, RotatingKVCache, make_prompt_cache
    from mlx_lm.utils import load as mlx_lm_load

    from backends.mlx.device_rows import MlxRows
    from backends.mlx.draft_heads import MlxDraftHeads
    from backends.mlx.state_files import MlxStateFiles
except ImportError as error:  # pragma: no cover - exercised where mlx is absent
    raise RuntimeUnavailableError(
        "mlx and mlx-lm are not installed. On Apple Silicon run packaging/install.sh, or "
        "`pip install mlx mlx-lm` in draftpen's environment; elsewhere use --runtime llamacpp."
    ) from error

# Facts the GGUF converter (app/gguf_to_mlx.py) records next to the weights.
CONVERSION_FACTS = "draftpen-mlx.json"
PREFILL_CHUNK = 512
_VOCAB_TYPES = {"BPE": "bpe", "Unigram": "ugm", "WordPiece": "wpm"}


def mlx_version() -> str:
    """The installed mlx version."""
    return str(mx.__version__)


def uses_gpu() -> bool:
    """Whether MLX computes on a GPU (Metal or CUDA) here rather than on the CPU."""
    return mx.default_device().type == mx.DeviceType.gpu


def _parallel_refusal(recurrent: bool, parallel: int) -> str | None:
    """Why a model asked for ``parallel`` sequences loads with one (None: it does not)."""
    if parallel > 1 and recurrent:
        return "a hybrid target's recurrent state rolls back by replay, one sequence at a time"
    return None


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable stand-in character -> byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


class MlxModel(MlxStateFiles, MlxDraftHeads):
    """An mlx-lm model with one prompt cache that rolls back (trimmed, or restored), whose
    saved states can be written to files (``MlxStateFiles``), and that feeds a draft
    head (``MlxDraftHeads``)."""

    prefill_chunk = PREFILL_CHUNK

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 4096,
        name: str | None = None,
        cpu_float32: bool = True,
        device_sampling: bool | None = None,
        parallel: int = 1,
        exact_output: bool = False,
    ) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        # Exact output: sequences beside others read their forwards as alone (sequences.py).
        self.exact_output = exact_output
        # Sampling math on the device (see forward_rows); by default where that is a
        # GPU. MLX's CPU kernels for it are slower than numpy on the same cores.
        self.device_sampling = uses_gpu() if device_sampling is None else device_sampling
        try:
            self._model, self._tokenizer = self._load(self.path)
        except (FileNotFoundError, ValueError, OSError) as error:
            raise ModelLoadError(
                f"mlx-lm could not load {path} ({error}). Download the model again, or "
                "use --runtime llamacpp."
            ) from error
        self.cpu_float32 = cpu_float32 and not uses_gpu()
        self._head = None
        self._head_capture = None
        if self.cpu_float32:
            # MLX's CPU kernels are fastest (and most precise) in float32: measured on
            # SmolLM2, one token takes 265 ms in float32, 334 in bfloat16, 685 in float16.
            self._model.set_dtype(mx.float32)
            # Converted now, on this thread: MLX streams are per thread, and a parallel
            # model's forwards run on the runtime thread, which cannot run this one's.
            mx.eval(self._model.parameters())
        self._cache = make_prompt_cache(self._model)
        refusal = untrimmable_cache_reason(
            self._cache, sliding=RotatingKVCache, recurrent=ArraysCache
        )
        if refusal is not None:
            raise ModelLoadError(
                f"{self.name} cannot be used for speculative decoding on MLX: {refusal}, "
                "and rejected draft tokens must be forgotten. Use --runtime llamacpp for "
                "this model, or pick another pair."
            )
        self._rollback = cache_rollback(self._cache, recurrent=ArraysCache)
        self.recurrent = self._rollback.recurrent
        self.rollback_limit = self._rollback.rollback_limit  # None: any depth, for free
        # ``parallel`` N > 1: N views generate at once (backends/mlx/sequences.py).
        self.parallel_refusal = _parallel_refusal(self.recurrent, parallel)
        self.parallel = 1 if self.parallel_refusal else max(1, parallel)
        self._state_owner: object = self  # the views' states are the loaded model's
        self.n_ctx = n_ctx
        self.size_bytes = sum(f.stat().st_size for f in self.path.glob("*.safetensors"))
        self._tokens: list[int] = []
        self._facts = self._read_conversion_facts()
        self.n_vocab = self._output_width()
        hf = self._tokenizer._tokenizer
        self._hf = hf
        added_tokens = hf.added_tokens_decoder  # built afresh on every access: read once
        self._added_ids = frozenset(added_tokens)
        self._special_ids = frozenset(
            index for index, added in added_tokens.items() if added.special
        )
        decoder = hf.backend_tokenizer.decoder
        self._byte_level = decoder is not None and type(decoder).__name__ == "ByteLevel"
        self._bytes_from_char = _byte_decoder() if self._byte_level else {}
        self._piece_cache: dict[int, bytes] = {}
        self._info = self._vocab_info()
        self._end_ids = frozenset(
            self._facts.get("end_of_generation_ids") or self._tokenizer.eos_token_ids
        )
        self.chat_template = self._facts.get("chat_template") or hf.chat_template

    def _load(self, path: Path) -> tuple[Any, Any]:
        """mlx-lm's model and tokenizer from ``path`` (a split target loads its share)."""
        return mlx_lm_load(str(path))

    def _read_conversion_facts(self) -> dict[str, Any]:
        marker = self.path / CONVERSION_FACTS
        if not marker.is_file():
            return {}
        return dict(json.loads(marker.read_text(encoding="utf-8")))

    def _output_width(self) -> int:
        args = getattr(self._model, "args", None)
        width = getattr(args, "vocab_size", None)
        if width is None:
            width = len(self._tokenizer._tokenizer)
        return int(width)

    # -- metadata and tokens -------------------------------------------------

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens whose positions the KV cache holds."""
        return self._tokens

    def _vocab_info(self) -> VocabInfo:
        facts = self._facts
        if facts:
            return VocabInfo(
                vocab_type=str(facts["vocab_type"]),
                n_vocab=self.n_vocab,
                bos_id=int(facts["bos_id"]),
                eos_id=int(facts["eos_id"]),
                add_bos=bool(facts["add_bos"]),
                add_eos=bool(facts["add_eos"]),
            )
        hf = self._hf
        kind = type(hf.backend_tokenizer.model).__name__
        vocab_type = _VOCAB_TYPES.get(kind, kind.lower() or "unknown")
        if vocab_type == "bpe" and not self._byte_level:
            vocab_type = "spm"  # sentencepiece BPE (Llama 2, Mistral) as llama.cpp names it
        bos_id = hf.bos_token_id if hf.bos_token_id is not None else -1
        eos_id = hf.eos_token_id if hf.eos_token_id is not None else -1
        probe = hf.encode("a", add_special_tokens=True)
        return VocabInfo(
            vocab_type=vocab_type,
            n_vocab=self.n_vocab,
            bos_id=bos_id,
            eos_id=eos_id,
            add_bos=bos_id >= 0 and probe[:1] == [bos_id],
            add_eos=eos_id >= 0 and probe[-1:] == [eos_id],
        )

    def vocab_info(self) -> VocabInfo:
        """Tokenizer facts for the pair check."""
        return self._info

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Text to tokens; special-token text is parsed as special tokens."""
        tokens = list(self._hf.encode(text, add_special_tokens=False))
        info = self._info
        if add_special and info.add_bos and info.bos_id >= 0:
            tokens.insert(0, info.bos_id)
        if add_special and info.add_eos and info.eos_id >= 0:
            tokens.append(info.eos_id)
        return tokens

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text for a token."""
        text = self._hf.convert_ids_to_tokens(token)
        return text if isinstance(text, str) else ""

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token; special tokens render as nothing."""
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_of(token)
            self._piece_cache[token] = piece
        return piece

    def _piece_of(self, token: int) -> bytes:
        if token in self._special_ids:
            return b""
        text = self.token_text(token)
        if token in self._added_ids:
            return text.encode("utf-8")  # added tokens are stored as plain text
        if self._byte_level:
            return bytes(self._bytes_from_char.get(char, 0x3F) for char in text)
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            return bytes([int(text[3:5], 16)])  # sentencepiece byte fallback
        return text.replace("\u2581", " ").encode("utf-8")

    def is_end_of_generation(self, token: int) -> bool:
        """EOS and the other tokens that end a reply (<|im_end|>, <|endoftext|>, ...)."""
        return token in self._end_ids

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        template_variables: Mapping[str, Any] | None = None,
    ) -> str:
        """Render the conversation with the model's own chat template."""
        return render_with_model_tokens(
            self, self.chat_template, messages, tools=tools, template_variables=template_variables
        )

    # -- evaluation ----------------------------------------------------------

    def _check_room(self, count: int) -> None:
        needed = len(self._tokens) + count
        if needed > self.n_ctx:
            raise ContextOverflowError(
                f"The conversation needs {needed} tokens but the context holds "
                f"{self.n_ctx}. Start a new chat or raise the context length."
            )

    def _run(self, tokens: Sequence[int]) -> Any:
        """Push ``tokens`` through the model into the cache; return the lazy logits."""
        # MLX gathers embeddings without bounds checks: a bad id would crash the process.
        if min(tokens) < 0 or max(tokens) >= self.n_vocab:
            raise DecodeError(f"token ids must lie in [0, {self.n_vocab}); got {list(tokens)}")
        inputs = mx.array([list(tokens)], dtype=mx.int32)
        logits = self._model(inputs, cache=self._cache)
        self._feed_head(len(self._tokens), tokens)
        self._tokens.extend(tokens)
        return logits

    def prefill(self, tokens: Sequence[int], *, replay: bool = False) -> None:
        """Evaluate tokens into the cache without ever computing the output layer (a
        ``replay`` after a rollback is queued, ``async_eval``, while the host drafts)."""
        self._check_room(len(tokens))
        for offset in range(0, len(tokens), PREFILL_CHUNK):
            self._run(tokens[offset : offset + PREFILL_CHUNK])
            # Only the cache is evaluated; the lazy logits graph is dropped unevaluated.
            (mx.async_eval if replay else mx.eval)([layer.state for layer in self._cache])
        if not replay:
            self._rollback.prefilled(len(self._tokens), len(tokens))

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` in one pass; return float32 logits, one row per token."""
        return np.array(self._device_logits(tokens, last_only=last_only), copy=False)

    def _device_logits(self, tokens: Sequence[int], *, last_only: bool) -> mx.array:
        """The forward pass's float32 logits, evaluated, still on the device."""
        count = len(tokens)
        if count == 0:
            raise ValueError("forward needs at least one token")
        self._check_room(count)
        if last_only and count > 1:
            self.prefill(tokens[:-1])
            tokens = tokens[-1:]
        self._rollback.before_forward(len(self._tokens), len(tokens))
        logits = self._run(tokens)[0].astype(mx.float32)
        mx.eval(logits, [layer.state for layer in self._cache])
        return logits

    def forward_rows(self, tokens: Sequence[int], *, last_only: bool = False) -> LogitRows:
        """Like :meth:`forward`, with the logits left on the device when sampling runs there.

        Argmaxes, filtered distributions and confidences are then computed by MLX and
        only their ids and probabilities copied back (:class:`MlxRows`); a whole row
        crosses only where the loop asks for one (penalties, a grammar, logprobs).
        """
        if not self.device_sampling:
            return HostRows(self.forward(tokens, last_only=last_only))
        return MlxRows(self._device_logits(tokens, last_only=last_only))

    def rollback(self, n_keep: int) -> None:
        """Forget cached positions from ``n_keep`` on, by trimming mlx-lm's prompt cache
        (a recurrent state: by restoring a snapshot and replaying the tokens past it)."""
        n_keep = max(0, n_keep)
        if n_keep < len(self._tokens):
            if self._head is not None:
                self._head.target_rolled_back(n_keep)
            self.prefill(self._rollback.rollback(self._tokens, n_keep), replay=True)

    def keep_rollback_point(self) -> None:
        """A later rollback will come back to the current end: snapshot a recurrent state."""
        self._rollback.keep_point(len(self._tokens))

    def reusable_prefix(self, shared: int) -> int:
        """How many of the first ``shared`` cached tokens a rollback to ``shared`` keeps
        without evaluating them again (all, but where a recurrent state's snapshots end)."""
        return self._rollback.reusable_prefix(len(self._tokens), shared)

    # -- keeping conversations -----------------------------------------------

    def save_state(self) -> SequenceState:
        """A deep copy of mlx-lm's prompt cache (as mlx-lm's own server keeps them).

        A copy, not the live objects: the cache layers change in place as decoding
        goes on (their offsets, and slice assignment into their key/value buffers).
        """
        saved = copy.deepcopy(self._cache)
        mx.eval([layer.state for layer in saved])
        return SequenceState(
            tuple(self._tokens),
            cache_nbytes(saved, recurrent=ArraysCache),
            saved,
            owner=self._state_owner,
        )

    def restore_state(self, state: SequenceState) -> None:
        """Make a fresh copy of a saved prompt cache the live one."""
        if state.owner is not self._state_owner:
            raise ValueError(f"this state was saved by another model, not {self.name}")
        restored = copy.deepcopy(state.payload)
        mx.eval([layer.state for layer in restored])
        self._cache = restored
        self._tokens = list(state.tokens)
        self._rollback.attach(restored)  # a recurrent state: whole, its snapshots forgotten
        if self._head is not None:
            self._head.target_replaced()

    def close(self) -> None:
        """Drop the weights and the cache (MLX frees memory when arrays go away)."""
        self._close_head()
        self._cache = []
        self._model = None
        mx.clear_cache()
