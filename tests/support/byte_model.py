"""A byte-level scripted fake model for the chat app's tests.

:class:`ScriptedByteModel` implements the ``Model`` protocol over the 256 byte values
plus four special tokens, so any text (capitals, backticks, Markdown) can be a reply.
Reply number n of a conversation (counted by ``<|assistant|>`` markers) is
``replies[n - 1]`` (the last one repeats), written greedily, then EOS.

To stop a reply part-way in a test: ``hold_after=N`` makes ``forward`` block once N
reply tokens exist, until ``release`` is set; ``holding`` is set while it waits.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from backends.base import ChatMessage, ToolSpec, VocabInfo
from backends.errors import DecodeError
from tests.support.fakes import fake_chat_template

EOS, BOS, USER, ASSISTANT = 0, 1, 2, 3
SPECIALS = {"<eos>": EOS, "<bos>": BOS, "<|user|>": USER, "<|assistant|>": ASSISTANT}
BYTE_OFFSET = 4
N_VOCAB = BYTE_OFFSET + 256


class ScriptedByteModel:
    """A fake model that writes scripted replies; see the module docstring."""

    def __init__(
        self,
        replies: Sequence[str],
        *,
        name: str = "scripted-bytes",
        n_ctx: int = 4096,
        hold_after: int | None = None,
    ) -> None:
        self.name = name
        self.n_vocab = N_VOCAB
        self.n_ctx = n_ctx
        self.replies = [self._bytes_tokens(reply.encode()) for reply in replies]
        self.hold_after = hold_after
        self.holding = threading.Event()
        self.release = threading.Event()
        self.closed = False
        self._cache: list[int] = []

    @staticmethod
    def _bytes_tokens(data: bytes) -> list[int]:
        return [BYTE_OFFSET + byte for byte in data]

    @property
    def cached_tokens(self) -> tuple[int, ...]:
        """The cached token ids."""
        return tuple(self._cache)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """UTF-8 bytes, with special-token text turned into the special token."""
        tokens = [BOS] if add_special else []
        position = 0
        while position < len(text):
            special = next((s for s in SPECIALS if text.startswith(s, position)), None)
            if special is not None:
                tokens.append(SPECIALS[special])
                position += len(special)
            else:
                tokens.extend(self._bytes_tokens(text[position].encode()))
                position += 1
        return tokens

    def token_bytes(self, token: int) -> bytes:
        """A byte token's byte; specials are empty."""
        return bytes([token - BYTE_OFFSET]) if token >= BYTE_OFFSET else b""

    def token_text(self, token: int) -> str:
        """The text of a token (specials by name)."""
        for text, special in SPECIALS.items():
            if special == token:
                return text
        return self.token_bytes(token).decode("utf-8", errors="backslashreplace")

    def is_end_of_generation(self, token: int) -> bool:
        """EOS ends a reply."""
        return token == EOS

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> str:
        """The fakes' chat template (:func:`tests.support.fakes.fake_chat_template`), no tools."""
        return fake_chat_template(messages)

    def vocab_info(self) -> VocabInfo:
        """The same tokenizer facts for every instance."""
        return VocabInfo("fake-utf8-bytes", N_VOCAB, BOS, EOS, add_bos=True, add_eos=False)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Append tokens without logits."""
        self._check(tokens)
        self._cache.extend(tokens)

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Append tokens; return the scripted logits for each new position."""
        if not tokens:
            raise DecodeError("forward() needs at least one token")
        self._check(tokens)
        self._maybe_hold()
        rows = []
        for token in tokens:
            self._cache.append(int(token))
            rows.append(self._logits_after(self._cache))
        logits = np.stack(rows).astype(np.float32)
        return logits[-1:] if last_only else logits

    def rollback(self, n_keep: int) -> None:
        """Forget cached positions from ``n_keep`` on."""
        if not 0 <= n_keep <= len(self._cache):
            raise ValueError(f"rollback({n_keep}) with {len(self._cache)} cached positions")
        del self._cache[n_keep:]

    def close(self) -> None:
        """Mark the model closed (using it afterwards raises)."""
        self.closed = True

    def _check(self, tokens: Sequence[int]) -> None:
        if self.closed:
            raise DecodeError("the model was closed")
        if len(self._cache) + len(tokens) > self.n_ctx:
            raise DecodeError("context full")

    def _maybe_hold(self) -> None:
        if self.hold_after is None or ASSISTANT not in self._cache:
            return
        last_marker = len(self._cache) - 1 - self._cache[::-1].index(ASSISTANT)
        if len(self._cache) - last_marker - 1 >= self.hold_after:
            self.holding.set()
            self.release.wait(timeout=30)

    def _logits_after(self, context: Sequence[int]) -> np.ndarray:
        row = np.zeros(N_VOCAB, dtype=np.float32)
        markers = [index for index, token in enumerate(context) if token == ASSISTANT]
        if not markers:
            row[EOS] = 5.0
            return row
        script = self.replies[min(len(markers), len(self.replies)) - 1]
        written = len(context) - markers[-1] - 1
        row[script[written] if written < len(script) else EOS] = 30.0
        return row
