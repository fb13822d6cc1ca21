"""The forwards of several sequences of one MLX model, run as one mlx-lm forward.

Each sequence's view (``sequences.py``) submits its forward and waits; the runtime
thread (``backends/runtime_exchange.py``) asks :meth:`ForwardBatcher.ready_work`
whether to run what has gathered. As for llama.cpp (``backends/llamacpp/
decode_batcher.py``), a batch is ready when every generating sequence has submitted,
or when the oldest forward has waited a grace (a share of the last forward's time), so
a lone sequence never waits.

What gathers differs, because an MLX batch is ``[B, L]``, each row padded to the
longest (``batched_forward.py``): the sequences' rounds (a verify of K+1 tokens, a
draft step, a plain decode) gather into one forward, while a prompt chunk, tens of
tokens, runs by itself rather than pad every round to its length. Chunks and rounds
take turns in the order they came, so a long prompt never holds the others' rounds
back for more than one chunk.

Exactness: a forward run by itself is the very call the model makes alone. A gathered
one rounds as alone where ``batch_exact`` was measured on the loaded model (the same
rows, bit for bit, from a probe forward) and, under exact output, only up to
``exact_limit`` rows (the calibration's largest batch that rounds like one-token
decoding). Elsewhere, under exact output, every forward runs by itself (in turn).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from backends.mlx.batched_forward import forward_together
from backends.mlx.layer_capture import LayerCapture
from backends.runtime_exchange import GatheringBatcher, smoothed
from backends.sequence_head import SequenceHead

# A prompt chunk is about PROMPT_SECONDS' worth of reading at the measured speed (the
# others' rounds wait for one chunk at most), within [MIN_PROMPT_CHUNK, MAX_PROMPT_CHUNK].
PROMPT_SECONDS = 0.5
MIN_PROMPT_CHUNK = 32
MAX_PROMPT_CHUNK = 512
# Beside others, a chunk costs about BESIDE_SHARE times their round (as
# decode_batcher.py does for llama.cpp), and reads at least MIN_BESIDE tokens.
BESIDE_SHARE = 2.0
MIN_BESIDE = 16


@dataclass(eq=False)
class ForwardRequest:
    """One sequence's ``tokens`` through the model into its ``cache`` (its layers);
    ``logits``: whether its rows are wanted (a round) or only the cache (a prompt);
    ``head``: the sequence's draft head, fed its rows of the captured layers, which
    the tokens take from position ``start`` on."""

    seq: int
    cache: Sequence[Any]
    tokens: Sequence[int]
    logits: bool
    arrived: float
    head: SequenceHead | None = None
    start: int = 0
    rows: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


class ForwardBatcher(GatheringBatcher):
    """Gathers one MLX model's forwards, sequence by sequence, into batches."""

    def __init__(
        self,
        model: Any,
        *,
        name: str,
        condition: threading.Condition,
        gathers: bool,
        arriving: Callable[[], bool] | None = None,
        capture: LayerCapture | None = None,
    ) -> None:
        super().__init__(condition, arriving)
        self._model = model
        # The layers a draft head reads, recorded at every forward (the model's head's:
        # backends/mlx/draft_heads.py); each sequence's head gets its own rows of them.
        self._capture = capture
        self.name = name
        # Whether this model's rounds can share a forward at all (its family's attention
        # runs per sequence, batched_forward.gathers_attention), and whether its rows
        # then round as alone (measured by sequences.py).
        self.gathers = gathers
        self.batch_exact = False
        # Exact output: set (by backends/engine_slots.py) to the largest batch whose rows
        # round like one-token decoding; None: any batch will do (fast output).
        self.exact_limit: int | None = None
        self._pending: list[ForwardRequest] = []
        self._seconds_per_token: float | None = None
        self._round_seconds: float | None = None  # a forward of rounds, smoothed
        self.gathered = 0  # of them, ones that carried several sequences

    # -- generation threads (condition not held) -------------------------------

    def prompt_chunk(self, seq: int | None = None) -> int:
        """How many prompt tokens ``seq``'s next forward reads: about PROMPT_SECONDS'
        worth alone; while another sequence generates or a request is arriving, only
        what costs about BESIDE_SHARE of their round (at least MIN_BESIDE tokens), so
        their rounds, which take turns with the chunks, wait little for one."""
        if self._seconds_per_token is None:
            return MIN_PROMPT_CHUNK * 2
        alone = max(
            MIN_PROMPT_CHUNK, min(MAX_PROMPT_CHUNK, int(PROMPT_SECONDS / self._seconds_per_token))
        )
        with self.condition:
            busy = self.others_busy(set() if seq is None else {seq})
        if not busy or self._round_seconds is None:
            return alone
        beside = int(BESIDE_SHARE * self._round_seconds / self._seconds_per_token)
        return max(MIN_BESIDE, min(alone, beside))

    def forward(
        self,
        seq: int,
        cache: Sequence[Any],
        tokens: Sequence[int],
        *,
        logits: bool,
        head: SequenceHead | None = None,
        start: int = 0,
    ) -> np.ndarray | None:
        """Run ``tokens`` into ``cache`` with the others gathered; the float32 logits rows
        (a host copy) when ``logits``; ``head`` (the sequence's, its cache holding
        ``start`` positions) is fed the forward's rows. Raises what the forward raised."""
        request = ForwardRequest(seq, cache, tokens, logits, time.monotonic(), head, start)
        self.hand_over(request)
        return request.rows

    # -- the runtime thread ----------------------------------------------------

    def ready_work(self, now: float) -> tuple[Callable[[], None] | None, float | None]:
        """The batch to run now, or when to look again (condition held)."""
        if not self._pending:
            return None, None
        waiting_for = self.waiting_for({request.seq for request in self._pending})
        due = self.due(self._pending[0].arrived)
        if waiting_for and self._pending[0].logits and now < due:
            return None, due
        group = self._take_group()
        return lambda: self._run(group), None

    def _may_gather(self) -> bool:
        if not self.gathers:
            return False
        return self.exact_limit is None or self.batch_exact

    def _take_group(self) -> list[ForwardRequest]:
        """The oldest request, and when it is a round, the other rounds that may share
        its forward: under exact output, up to ``exact_limit`` rows of ``[B, L]``
        (condition held)."""
        first = self._pending[0]
        group = [first]
        if first.logits and self._may_gather():
            limit = self.exact_limit
            for request in self._pending[1:]:
                if not request.logits:
                    continue
                width = max(len(r.tokens) for r in [*group, request])
                if limit is not None and width * (len(group) + 1) > limit:
                    continue
                group.append(request)
        for request in group:
            self._pending.remove(request)
        return group

    def _run(self, group: list[ForwardRequest]) -> None:
        """Run ``group`` in one forward and hand out the results."""
        started = time.perf_counter()
        ends = [[int(layer.offset) for layer in request.cache] for request in group]
        try:
            self._forward(group)
        except BaseException as error:  # every request of the batch fails with it
            for request, offsets in zip(group, ends, strict=True):
                request.error = error
                # Its cache keeps none of the failed forward: it must still hold what
                # its view's cached tokens say.
                for layer, offset in zip(request.cache, offsets, strict=True):
                    layer.trim(int(layer.offset) - offset)
        seconds = time.perf_counter() - started
        with self.condition:
            self.ran(seconds)
            if group[0].logits:
                self._round_seconds = smoothed(self._round_seconds, seconds)
            if not group[0].logits and len(group[0].tokens) >= MIN_PROMPT_CHUNK:
                self._seconds_per_token = smoothed(
                    self._seconds_per_token, seconds / len(group[0].tokens)
                )
            self.gathered += len(group) > 1
            for request in group:
                request.done = True
            self.condition.notify_all()

    def _forward(self, group: list[ForwardRequest]) -> None:
        if len(group) == 1:
            # By itself: exactly the call the model makes alone (backends/mlx/model.py).
            request = group[0]
            out = self._model(mx.array([list(request.tokens)], dtype=mx.int32), cache=request.cache)
            states = [layer.state for layer in request.cache]
            fed = self._head_rows(group)
            if not request.logits:
                mx.eval(states, fed)  # the output layer is never run for a prompt
                self._feed_heads(group, fed)
                return
            logits = out[0].astype(mx.float32)
            mx.eval(logits, states, fed)
            request.rows = np.array(logits)
            self._feed_heads(group, fed)
            return
        out = forward_together(
            self._model, [r.cache for r in group], [list(r.tokens) for r in group]
        )
        rows = [out[row, : len(r.tokens)].astype(mx.float32) for row, r in enumerate(group)]
        fed = self._head_rows(group)
        mx.eval(rows, [layer.state for r in group for layer in r.cache], fed)
        for request, logits in zip(group, rows, strict=True):
            request.rows = np.array(logits)
        self._feed_heads(group, fed)

    def _head_rows(self, group: list[ForwardRequest]) -> list[mx.array]:
        """Each request's rows of the captured layers in the forward just built (lazy,
        evaluated with it): row ``b`` of the ``[B, L]`` batch, its first
        ``len(tokens)`` positions (the rest is padding); none without a capture."""
        taken = self._capture.take() if self._capture is not None else None
        if taken is None:
            return []
        return [taken[row : row + 1, : len(r.tokens)] for row, r in enumerate(group)]

    @staticmethod
    def _feed_heads(group: list[ForwardRequest], fed: list[mx.array]) -> None:
        """Hand each sequence's head its rows (only once its forward is evaluated)."""
        if not fed:
            return
        for request, rows in zip(group, fed, strict=True):
            if request.head is not None:
                request.head.target_decoded(request.start, request.tokens, rows)
