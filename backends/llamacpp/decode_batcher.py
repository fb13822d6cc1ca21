"""The decodes of several sequences of one llama.cpp context, run as one ``llama_decode``.

Each sequence's view (``sequences.py``) submits its decode and waits; the runtime thread
(``backends/runtime_exchange.py``) asks :meth:`DecodeBatcher.ready_work` whether to run
what has gathered. A batch is ready when every sequence that is generating has
submitted, when the batch is full, or when the oldest decode has waited a grace: a
share of the last decode's time, so that a sequence busy with host work (sampling, a
grammar) delays the others by little, and a lone sequence never waits at all.

One decode then carries every gathered sequence's tokens with its own ``seq_id`` over
the one KV cache: on a GPU or Apple Silicon, a forward is bound by reading the weights,
so four sequences cost about what one does; on 2 CPU cores a 4-token forward costs
1.5x a 1-token one. Each request gets its own copy of its logits rows (the buffer is
the next decode's), and a failed decode fails every request in it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.errors import ContextOverflowError, DecodeError
from backends.llamacpp.ggml_devices import decode
from backends.llamacpp.library import last_llama_error, llama_cpp
from backends.runtime_exchange import GatheringBatcher, smoothed

# Prompt tokens a batch reads: about PROMPT_SECONDS' worth at the measured speed (a
# request arriving meanwhile waits for that much), within [MIN_PROMPT_CHUNK, n_batch].
# On 2 CPU cores and the 1.5B starter target, ~40 tokens (64 read at 86 tokens/s,
# 128 at 92: little is lost); on a GPU, the whole batch.
PROMPT_SECONDS = 0.5
MIN_PROMPT_CHUNK = 64
FIRST_PROMPT_CHUNK = 64
# While anything else runs (other sequences' rounds, a short prompt, a sequence
# setting up, a request arriving), a long prompt reads only what costs about
# BESIDE_SHARE times a round's own forward (at least MIN_BESIDE tokens, so it always
# moves): a chat's tokens keep coming at about a third of their speed alone, not at the
# pace of an agent's prompt (2 CPU cores: 4 tokens of prompt a round, against a
# 64-token chunk before; a GPU, where a few more rows cost little: a whole chunk).
BESIDE_SHARE = 2.0
MIN_BESIDE = 4


@dataclass(eq=False)
class DecodeRequest:
    """One sequence's tokens to decode at positions from ``start``; logits from
    ``logits_from`` on. The runtime thread fills ``logits`` or ``error``."""

    seq: int
    tokens: Sequence[int]
    start: int
    logits_from: int
    arrived: float
    remaining: int = 0  # a prompt chunk: the prompt tokens left to read, this one's included
    logits: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False
    # A prompt chunk is read in pieces, as much a batch as its neighbours allow:
    # ``taken`` tokens handed to batches so far, ``read`` of them decoded.
    taken: int = 0
    read: int = 0
    whole: DecodeRequest | None = None  # set on a piece: the chunk it is part of

    @property
    def is_prompt(self) -> bool:
        """A prompt chunk: it asks for no logits (so it may be read in pieces)."""
        return self.logits_from == len(self.tokens)

    def prompt_left(self) -> int:
        """Prompt tokens still to hand to a batch, this chunk's and the chunks after it."""
        return self.remaining - self.taken

    def take(self, count: int) -> DecodeRequest:
        """The next ``count`` of this prompt chunk's tokens, to decode in one batch:
        this request itself when that is all of it (condition held)."""
        begin = self.taken
        self.taken += count
        if begin == 0 and count == len(self.tokens):
            return self
        end = begin + count
        return DecodeRequest(
            self.seq,
            self.tokens[begin:end],
            self.start + begin,
            count,
            self.arrived,
            self.remaining - begin,
            whole=self,
        )


class DecodeBatcher(GatheringBatcher):
    """Gathers one context's decodes, sequence by sequence, into one batch."""

    def __init__(
        self,
        context: Any,
        *,
        n_batch: int,
        name: str,
        condition: threading.Condition,
        logits_rows: Callable[[int], np.ndarray],
        arriving: Callable[[], bool] | None = None,
        decoded: Callable[[int, int, Sequence[int], int], None] | None = None,
    ) -> None:
        super().__init__(condition, arriving)
        # Told of each request a decode evaluated, as (seq, start, tokens, first row of
        # the batch): a sequence's draft head keeps its rows of the target's layers.
        self._decoded = decoded
        self._context = context
        # The context's logits buffer as a view of its first n rows: the loaded model's
        # own (LlamaCppModel._logits_view), which keeps one view while the buffer stays.
        self._logits_rows = logits_rows
        self.n_batch = n_batch
        self.name = name
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        batch = self._batch
        self._tokens = np.ctypeslib.as_array(batch.token, shape=(n_batch,))
        self._positions = np.ctypeslib.as_array(batch.pos, shape=(n_batch,))
        self._wants_logits = np.ctypeslib.as_array(batch.logits, shape=(n_batch,))
        np.ctypeslib.as_array(batch.n_seq_id, shape=(n_batch,))[:] = 1
        self._row_seq = [-1] * n_batch  # the seq_id each row of the batch holds now
        self._pending: list[DecodeRequest] = []
        self._seconds_per_token: float | None = None  # measured on batches of 64 or more
        self._round_seconds: float | None = None  # a batch of rounds only, smoothed
        # What a prompt token adds to a batch of rounds: a CPU reads a few tokens far
        # dearer each than a chunk's (1 round + 7 prompt tokens: 190 ms, against 36 ms
        # and 11 ms a token in 64-token chunks, 2-core EPYC).
        self._beside_seconds_per_token: float | None = None
        # Exact kernels: the largest batch whose rows round like one-token decoding
        # (the calibration's exact_batch_limit); None: any batch will do.
        self.exact_limit: int | None = None

    # -- generation threads (condition not held) -------------------------------

    def prompt_chunk(self) -> int:
        """How many prompt tokens one batch reads (see PROMPT_SECONDS)."""
        if self._seconds_per_token is None:
            return min(FIRST_PROMPT_CHUNK, self.n_batch)
        tokens = int(PROMPT_SECONDS / self._seconds_per_token)
        return max(MIN_PROMPT_CHUNK, min(self.n_batch, tokens))

    def beside_chunk(self) -> int:
        """How many tokens of a long prompt a batch reads beside other work (see
        BESIDE_SHARE); MIN_BESIDE until a round and a prompt have been timed."""
        per_token = self._beside_seconds_per_token or self._seconds_per_token
        if per_token is None or self._round_seconds is None:
            return MIN_BESIDE
        tokens = int(BESIDE_SHARE * self._round_seconds / per_token)
        return max(MIN_BESIDE, min(self.prompt_chunk(), tokens))

    def decode(
        self, seq: int, tokens: Sequence[int], start: int, logits_from: int, remaining: int = 0
    ) -> np.ndarray | None:
        """Decode ``tokens`` for ``seq`` with the others gathered; its logits rows (a
        copy) when it asked for any. ``remaining``: a prompt chunk's prompt tokens
        left (the fewest go first). Raises what the decode raised."""
        if len(tokens) > self.n_batch:
            raise ValueError(f"{len(tokens)} tokens exceed the batch size {self.n_batch}")
        request = DecodeRequest(seq, tokens, start, logits_from, time.monotonic(), remaining)
        self.hand_over(request)
        return request.logits

    # -- the runtime thread ----------------------------------------------------

    def ready_work(self, now: float) -> tuple[Callable[[], None] | None, float | None]:
        """The batch to run now, or when to look again (condition held)."""
        if not self._pending:
            return None, None
        waiting_for = self.waiting_for({request.seq for request in self._pending})
        # A prompt chunk counts for what one batch would read of it.
        queued = sum(
            min(len(r.tokens) - r.taken, self.prompt_chunk()) if r.is_prompt else len(r.tokens)
            for r in self._pending
        )
        due = self.due(self._pending[0].arrived)
        room = self.n_batch if self.exact_limit is None else self.exact_limit
        if waiting_for and queued < room and now < due:
            return None, due
        group = self._take_group()
        return lambda: self._run(group), None

    def _take_group(self) -> list[DecodeRequest]:
        """The pending requests that fit one batch, oldest first (condition held).

        Under exact kernels a batch's rows round like one-token decoding only up to
        ``exact_limit`` tokens, and a prompt chunk's rows only when it is read as it
        would be alone: so a chunk of a prompt (or any decode past the limit) runs by
        itself, and rounds gather up to the limit.
        """
        limit = self.exact_limit
        first = self._pending[0]
        if limit is not None and (len(first.tokens) > limit or first.is_prompt):
            group = [first]
        elif limit is not None:
            group, room = [], limit
            for request in self._pending:
                if not request.is_prompt and len(request.tokens) <= room:
                    group.append(request)
                    room -= len(request.tokens)
        else:
            group = self._rounds_then_prompts()
        for request in group:
            if request.whole is None:
                request.taken = len(request.tokens)
        self._pending = [r for r in self._pending if r.taken < len(r.tokens)]
        return group

    def _rounds_then_prompts(self) -> list[DecodeRequest]:
        """Every waiting round; then the prompts that end within a chunk, nearest their
        end first; then pieces of longer prompts: a chunk's worth when nothing else
        runs, else only :meth:`beside_chunk` tokens. So a short chat's setup, its
        prompt and its rounds never wait for a chunk of an agent's prompt, and the
        agent's prompt still moves every batch (condition held)."""
        rounds = [r for r in self._pending if not r.is_prompt]
        prompts = sorted(
            (r for r in self._pending if r.is_prompt),
            key=lambda request: (request.prompt_left(), request.arrived),
        )
        group: list[DecodeRequest] = []
        room = self.n_batch
        for request in rounds:
            if len(request.tokens) <= room:
                group.append(request)
                room -= len(request.tokens)
        chunk = self.prompt_chunk()
        prompt_room = min(room, chunk)
        long: list[DecodeRequest] = []
        for request in prompts:
            if request.prompt_left() > chunk:
                long.append(request)
                continue
            count = len(request.tokens) - request.taken
            if count <= prompt_room:
                group.append(request.take(count))
                prompt_room -= count
        # Other work, in this batch or on its way (a sequence generating: between its
        # rounds, or still setting up, its cache's state restored on this thread; a
        # request arriving), gets batches kept short; long prompts alone share whole
        # chunks.
        if group or self.others_busy({request.seq for request in long}):
            prompt_room = min(prompt_room, self.beside_chunk())
        for request in long:
            count = min(len(request.tokens) - request.taken, prompt_room)
            if count > 0:
                group.append(request.take(count))
                prompt_room -= count
        return group

    def _run(self, group: list[DecodeRequest]) -> None:
        """Decode ``group`` in one ``llama_decode`` and hand out the results."""
        started = time.perf_counter()
        try:
            self._decode(group)
        except BaseException as error:  # every request of the batch fails with it
            for request in group:
                request.error = error
        seconds = time.perf_counter() - started
        tokens = sum(len(request.tokens) for request in group)
        with self.condition:
            self.ran(seconds)
            if tokens >= MIN_PROMPT_CHUNK:
                self._seconds_per_token = smoothed(self._seconds_per_token, seconds / tokens)
            prompt_tokens = sum(len(r.tokens) for r in group if r.is_prompt)
            if not prompt_tokens:
                self._round_seconds = smoothed(self._round_seconds, seconds)
            elif prompt_tokens < tokens and self._round_seconds is not None:
                added = max(seconds - self._round_seconds, 0.0) / prompt_tokens
                self._beside_seconds_per_token = smoothed(self._beside_seconds_per_token, added)
            for request in group:
                request.done = True
                if request.whole is not None:
                    self._piece_done(request)
            self.condition.notify_all()

    def _piece_done(self, piece: DecodeRequest) -> None:
        """Count ``piece`` as read into its chunk; the chunk is done once all of it is,
        or at the first piece that failed (condition held)."""
        whole = piece.whole
        assert whole is not None
        whole.read += len(piece.tokens)
        if piece.error is not None and whole.error is None:
            whole.error = piece.error
            if whole in self._pending:
                self._pending.remove(whole)
        whole.done = whole.error is not None or whole.read == len(whole.tokens)

    def _decode(self, group: list[DecodeRequest]) -> None:
        # Rows in sequence order: with a KV stream per sequence (exact kernels) llama.cpp
        # puts only sequences of consecutive ids in one ubatch, and would split the
        # batch (one weight read each) where the order of arrival leaves gaps.
        group = sorted(group, key=lambda request: request.seq)
        row = 0
        batch = self._batch
        for request in group:
            count = len(request.tokens)
            end = row + count
            self._tokens[row:end] = request.tokens
            self._positions[row:end] = np.arange(request.start, request.start + count)
            self._wants_logits[row : row + request.logits_from] = 0
            self._wants_logits[row + request.logits_from : end] = 1
            for index in range(row, end):
                if self._row_seq[index] != request.seq:
                    batch.seq_id[index][0] = request.seq
                    self._row_seq[index] = request.seq
            row = end
        batch.n_tokens = row
        status = decode(self._context, batch, row)
        if status == 1:
            raise ContextOverflowError(
                "llama.cpp found no room in the KV cache for the sequences running at "
                "once. Start a new chat, or serve with a longer context or fewer --parallel."
            )
        if status != 0:
            raise DecodeError(f"llama_decode failed with status {status}: {last_llama_error()}")
        outputs = sum(len(r.tokens) - r.logits_from for r in group)
        if outputs:
            rows = self._logits_rows(outputs)
            offset = 0
            for request in group:
                wanted = len(request.tokens) - request.logits_from
                if wanted:
                    request.logits = rows[offset : offset + wanted].copy()
                    offset += wanted
        if self._decoded is not None:
            row = 0
            for request in group:
                self._decoded(request.seq, request.start, request.tokens, row)
                row += len(request.tokens)

    def close(self) -> None:
        """Free the batch (the context is its owner's)."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
