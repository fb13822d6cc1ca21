"""A GGUF model's tokenizer through llama.cpp: the token methods every loaded model has
(``LlamaCppTokens``), the vocabulary facts the pair check compares, and the
tokenizer-only load (``LlamaCppVocabulary``).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from backends.base import ChatMessage, ToolSpec, VocabInfo
from backends.errors import ModelLoadError
from backends.llamacpp.library import (
    check_gguf_file,
    ensure_backend,
    last_llama_error,
    llama_cpp,
    recent_errors,
)
from backends.output.chat_template import render_with_model_tokens

VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}


def vocab_token_text(vocab: Any, token: int) -> str:
    """A vocabulary's stored text for a token (shared by the model and the vocab-only load)."""
    raw = llama_cpp.llama_vocab_get_text(vocab, token)
    return raw.decode("utf-8", errors="replace") if raw else ""


def vocab_facts(vocab: Any, n_vocab: int) -> VocabInfo:
    """The tokenizer facts the pair check compares."""
    return VocabInfo(
        vocab_type=VOCAB_TYPES.get(int(llama_cpp.llama_vocab_type(vocab)), "unknown"),
        n_vocab=n_vocab,
        bos_id=int(llama_cpp.llama_vocab_bos(vocab)),
        eos_id=int(llama_cpp.llama_vocab_eos(vocab)),
        add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
    )


class LlamaCppTokens:
    """The tokenizer side of a loaded model: metadata, tokens and their bytes, the chat
    template (mixed into ``LlamaCppModel``, which sets ``_model``, ``_vocab``,
    ``n_vocab``, ``chat_template`` and the two caches)."""

    _model: Any
    _vocab: Any
    n_vocab: int
    chat_template: str | None
    _piece_cache: dict[int, bytes]
    _eog_cache: dict[int, bool]

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
        return vocab_token_text(self._vocab, token)

    def is_end_of_generation(self, token: int) -> bool:
        """EOS, EOT or any other token llama.cpp marks as ending generation."""
        known = self._eog_cache.get(token)
        if known is None:
            known = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
            self._eog_cache[token] = known
        return known

    def vocab_info(self) -> VocabInfo:
        """Tokenizer facts for the pair check."""
        return vocab_facts(self._vocab, self.n_vocab)

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


class LlamaCppVocabulary:
    """A GGUF file's tokenizer alone: llama.cpp's vocab-only load, no weights, no context.

    Enough for the pair check right after a download, in a fraction of a second even for
    a large model.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        check_gguf_file(self.path)
        ensure_backend()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        recent_errors.clear()
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode("utf-8"), params)
        if not self._model:
            raise ModelLoadError(
                f"llama.cpp could not read the tokenizer of {self.path} ({last_llama_error()}). "
                "The file may be truncated or corrupt: delete it and download it again."
            )
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text for a token."""
        return vocab_token_text(self._vocab, token)

    def vocab_info(self) -> VocabInfo:
        """Tokenizer facts for the pair check."""
        return vocab_facts(self._vocab, self.n_vocab)

    def close(self) -> None:
        """Free the vocabulary."""
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
