"""Fakes for testing the inference layer without a real model.

:class:`HashModel` implements the ``Model`` protocol of ``backends/base.py`` exactly,
over a 64-token byte vocabulary. Its logits are a pure function of the context: a
seeded hash of the last ``window`` tokens gives a random logits vector, and a tiny
grammar on top keeps the one split character ("é", two tokens) well formed. So a
batched ``forward`` equals one-by-one ``forward`` bit for bit, and the model can be
asked for the logits of any context directly (:meth:`HashModel.logits_for`).

It is strict where a real runtime would be: it tracks its KV cache honestly
(``forward``/``prefill`` append, ``rollback`` truncates, evaluating past ``n_ctx``
raises) and, like llama.cpp, returns logits as a *view* of one buffer that the next
call overwrites (with NaN first), so a consumer that keeps logits too long sees garbage.

Variants: a draft model is a ``HashModel`` with ``noise_scale > 0`` (the target's
logits plus seeded noise, so acceptance is partial); :class:`ScriptedTextModel` writes
a given text after the ``<|assistant|>`` token and then EOS. Running the loop over them
and recording what it did: tests/support/fake_runs.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.base import ChatMessage, SequenceState, ToolSpec, VocabInfo
from backends.errors import DecodeError

EOS = 0
BOS = 1
USER = 2
ASSISTANT = 3
E_ACUTE_HEAD = 4  # b"\xc3": first byte of "é"
E_ACUTE_TAIL = 5  # b"\xa9": second byte of "é"

SPECIAL_TEXT = {"<eos>": EOS, "<bos>": BOS, "<|user|>": USER, "<|assistant|>": ASSISTANT}

_WORD_PIECES = (
    " the",
    "the",
    "ing",
    "er",
    "at",
    "on",
    "in",
    "an",
    "re",
    "ed",
    "nd",
    "ou",
    "es",
    " a",
    "is",
    "st",
)

VOCAB: tuple[bytes, ...] = (
    b"",  # EOS
    b"",  # BOS
    b"",  # <|user|>
    b"",  # <|assistant|>
    b"\xc3",
    b"\xa9",
    "ü".encode(),
    b" ",
    b"\n",
    b".",
    b",",
    b"!",
    *(bytes([c]) for c in range(ord("a"), ord("z") + 1)),
    *(bytes([c]) for c in range(ord("0"), ord("9") + 1)),
    *(piece.encode() for piece in _WORD_PIECES),
)
N_VOCAB = len(VOCAB)
assert N_VOCAB == 64

# Text pieces the tokenizer matches, longest first; "é" is the split character.
_PIECES: dict[str, list[int]] = {
    VOCAB[token].decode(): [token] for token in range(6, N_VOCAB) if VOCAB[token]
}
_PIECES["é"] = [E_ACUTE_HEAD, E_ACUTE_TAIL]
_PIECES.update({text: [token] for text, token in SPECIAL_TEXT.items()})
_PIECES_LONGEST_FIRST = sorted(_PIECES, key=len, reverse=True)


def fake_chat_template(messages: Sequence[ChatMessage]) -> str:
    """``<|user|>text`` / ``<|assistant|>text<eos>`` turns, ending on ``<|assistant|>``.

    Every fake model renders conversations this way (system text counts as a user turn).
    """
    parts = []
    for message in messages:
        if message.role == "assistant":
            parts.append(f"<|assistant|>{message.content}<eos>")
        else:
            parts.append(f"<|user|>{message.content}")
    return "".join(parts) + "<|assistant|>"


class HashModel:
    """A deterministic fake language model implementing ``backends.base.Model``.

    ``logits_for(context)`` is a seeded hash of the last ``window`` tokens, scaled by
    ``scale``, with EOS shifted by ``eos_bias``; special tokens other than EOS are never
    produced; after the first half of "é" only its second half may follow, and the
    second half never appears elsewhere. ``noise_scale > 0`` adds seeded noise on top:
    that is a draft model whose ``q`` is near, not equal to, the target's ``p``.
    """

    def __init__(
        self,
        *,
        name: str = "hash-target",
        n_ctx: int = 512,
        window: int = 3,
        salt: int = 7,
        scale: float = 2.0,
        eos_bias: float = -1.0,
        noise_scale: float = 0.0,
        noise_salt: int = 99,
    ) -> None:
        self.name = name
        self.n_vocab = N_VOCAB
        self.n_ctx = n_ctx
        self.window = window
        self.salt = salt
        self.scale = scale
        self.eos_bias = eos_bias
        self.noise_scale = noise_scale
        self.noise_salt = noise_salt
        self.closed = False
        self.forward_calls = 0
        self.forward_batch_sizes: list[int] = []
        self.prefill_calls = 0
        self.prefill_token_count = 0
        self.rollback_calls = 0
        self._cache: list[int] = []
        self._buffer = np.full((n_ctx, N_VOCAB), np.nan, dtype=np.float32)
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    # -- the Model protocol -------------------------------------------------------

    @property
    def cached_tokens(self) -> tuple[int, ...]:
        """The tokens whose positions the cache holds (a copy)."""
        return tuple(self._cache)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Greedy longest-match tokenization; special-token text becomes the token."""
        tokens = [BOS] if add_special else []
        position = 0
        while position < len(text):
            for piece in _PIECES_LONGEST_FIRST:
                if text.startswith(piece, position):
                    tokens.extend(_PIECES[piece])
                    position += len(piece)
                    break
            else:
                raise ValueError(f"the fake vocabulary has no token for {text[position]!r}")
        return tokens

    def token_bytes(self, token: int) -> bytes:
        """The bytes of a token; special tokens are empty."""
        return VOCAB[token]

    def is_end_of_generation(self, token: int) -> bool:
        """Only EOS ends a reply."""
        return token == EOS

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> str:
        """The fakes' chat template (:func:`fake_chat_template`). Tools are not shown."""
        return fake_chat_template(messages)

    def vocab_info(self) -> VocabInfo:
        """Tokenizer facts (the same for every fake, so every pair is compatible)."""
        return VocabInfo("fake-bytes", N_VOCAB, BOS, EOS, add_bos=True, add_eos=False)

    def token_text(self, token: int) -> str:
        """The stored text of a token."""
        for text, special in SPECIAL_TEXT.items():
            if special == token:
                return text
        return VOCAB[token].decode("utf-8", errors="backslashreplace")

    def prefill(self, tokens: Sequence[int]) -> None:
        """Append tokens to the cache without logits."""
        self._check_room(tokens)
        self.prefill_calls += 1
        self.prefill_token_count += len(tokens)
        self._cache.extend(int(token) for token in tokens)

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Append tokens and return their logits as a view the next call overwrites."""
        if not tokens:
            raise DecodeError("forward() needs at least one token")
        self._check_room(tokens)
        self.forward_calls += 1
        self.forward_batch_sizes.append(len(tokens))
        self._buffer.fill(np.nan)
        for index, token in enumerate(tokens):
            self._cache.append(int(token))
            self._buffer[index] = self.logits_for(self._cache)
        if last_only:
            return self._buffer[len(tokens) - 1 : len(tokens)]
        return self._buffer[: len(tokens)]

    def rollback(self, n_keep: int) -> None:
        """Forget every cached position from ``n_keep`` on."""
        self._check_open()
        if not 0 <= n_keep <= len(self._cache):
            raise ValueError(f"rollback({n_keep}) with {len(self._cache)} cached positions")
        self.rollback_calls += 1
        del self._cache[n_keep:]

    def close(self) -> None:
        """Make the model unusable, as a real runtime's freed model is."""
        self.closed = True

    # -- for tests ------------------------------------------------------------------

    def logits_for(self, context: Sequence[int]) -> np.ndarray:
        """The logits after ``context`` (float32, shape ``(n_vocab,)``)."""
        if context and context[-1] == E_ACUTE_HEAD:
            row = np.full(N_VOCAB, -np.inf, dtype=np.float32)
            row[E_ACUTE_TAIL] = 0.0
            return row
        key = tuple(context[-self.window :])
        row = self._rows.get(key)
        if row is None:
            row = self._hashed_row(key)
            self._rows[key] = row
        return row

    def _hashed_row(self, key: tuple[int, ...]) -> np.ndarray:
        seed = [self.salt, len(key), *key]
        logits = np.random.default_rng(seed).standard_normal(N_VOCAB) * self.scale
        if self.noise_scale > 0:
            noise = np.random.default_rng([self.noise_salt, *seed]).standard_normal(N_VOCAB)
            logits += self.noise_scale * noise
        logits[EOS] += self.eos_bias
        logits[E_ACUTE_HEAD] += 1.0  # make the split character common
        logits[[BOS, USER, ASSISTANT, E_ACUTE_TAIL]] = -np.inf
        return logits.astype(np.float32)

    def _check_room(self, tokens: Sequence[int]) -> None:
        self._check_open()
        if len(self._cache) + len(tokens) > self.n_ctx:
            raise DecodeError(
                f"{len(tokens)} tokens do not fit: {len(self._cache)} of {self.n_ctx} used"
            )
        if any(not 0 <= int(token) < N_VOCAB for token in tokens):
            raise DecodeError(f"token id out of range in {list(tokens)}")

    def _check_open(self) -> None:
        if self.closed:
            raise DecodeError("the model is closed")


class StatefulHashModel(HashModel):
    """A :class:`HashModel` that can save and restore its cache (``SavesSequenceState``).

    A state "costs" ``bytes_per_token`` per cached position, so byte budgets can be
    tested; ``fail_restores`` makes restores fail as a runtime's can (cache emptied,
    ``DecodeError``). Counts its saves and restores.
    """

    def __init__(self, *, bytes_per_token: int = 100, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.bytes_per_token = bytes_per_token
        self.fail_restores = False
        self.saves = 0
        self.restores = 0

    def save_state(self) -> SequenceState:
        """The cached tokens are the whole state of a hash model."""
        self._check_open()
        self.saves += 1
        tokens = tuple(self._cache)
        return SequenceState(tokens, len(tokens) * self.bytes_per_token, tokens, owner=self)

    def restore_state(self, state: SequenceState) -> None:
        """Put a saved cache back (only this model's own states)."""
        self._check_open()
        if state.owner is not self:
            raise ValueError("this state was saved by another model")
        if self.fail_restores:
            self._cache.clear()
            raise DecodeError("restore failed (as asked)")
        self.restores += 1
        self._cache = list(state.payload)


def draft_model_for(target: HashModel, noise_scale: float = 1.0, **kwargs: object) -> HashModel:
    """A draft model: the target's logits plus seeded noise (partial acceptance)."""
    options: dict[str, object] = {
        "name": "hash-draft",
        "n_ctx": target.n_ctx,
        "window": target.window,
        "salt": target.salt,
        "scale": target.scale,
        "eos_bias": target.eos_bias,
        "noise_scale": noise_scale,
    }
    options.update(kwargs)
    return HashModel(**options)  # type: ignore[arg-type]


class ScriptedTextModel(HashModel):
    """Writes ``script`` after the last ``<|assistant|>`` token, then EOS.

    The script token gets ``margin`` added to the hashed logits, so greedy decoding
    writes the script exactly and sampling almost always does. Before any
    ``<|assistant|>`` the script position is the context length.
    """

    def __init__(self, script: str, *, margin: float = 30.0, **kwargs: object) -> None:
        super().__init__(**{"name": "scripted", **kwargs})  # type: ignore[arg-type]
        self.script_tokens = self.tokenize(script, add_special=False)
        self.margin = margin

    def logits_for(self, context: Sequence[int]) -> np.ndarray:
        """Hashed logits with the next script token (or EOS) strongly preferred."""
        start = 0
        for index in range(len(context) - 1, -1, -1):
            if context[index] == ASSISTANT:
                start = index + 1
                break
        written = len(context) - start
        row = super().logits_for(context).copy()
        if context and context[-1] == E_ACUTE_HEAD:
            return row
        wanted = self.script_tokens[written] if written < len(self.script_tokens) else EOS
        row[wanted] = max(float(row[wanted]), 0.0) + self.margin
        return row
