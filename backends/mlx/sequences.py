"""The sequences of a parallel MLX model, each a model of its own.

An :class:`~backends.mlx.model.MlxModel` loaded with ``parallel`` N > 1 is loaded
once; :func:`sequence_views` makes N :class:`MlxSequence` views of it. To the loop a
view is a model like any other: its own prompt cache (mlx-lm's, as alone), cached
tokens, rollback, saved states and chunked prompt reading. Its forwards go through
the model's :class:`~backends.mlx.forward_batcher.ForwardBatcher`, so the sequences
generating at once share each forward, and everything else that computes with MLX
(saving and restoring states, drafting with the model's head) runs on the runtime
thread (``backends/runtime_exchange.py``): MLX is not evaluated from two threads at once.
A model with a draft head attached (EAGLE-3, DFlash) gives each view a head state of
its own, fed that view's rows of each forward (``backends/sequence_head.py``).

This is the shape of ``backends/llamacpp/sequences.py``; the batching underneath is
MLX's own (``batched_forward.py``). A hybrid target (recurrent layers, restored by
snapshot and replay) loads with one sequence: ``parallel_refusal`` says why.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache

from backends.base import SequenceState
from backends.errors import BackendError, DecodeError
from backends.mlx.batched_forward import forward_together, gathers_attention
from backends.mlx.forward_batcher import ForwardBatcher
from backends.mlx.model import PREFILL_CHUNK, MlxModel
from backends.mlx.rollback import cache_rollback
from backends.mlx.state_files import MlxStateFiles
from backends.runtime_exchange import RuntimeExchange
from backends.sequence_head import SequenceHead

# The probe that measures whether a gathered forward's rows round as alone: two
# sequences at different positions, one verifying several tokens, one decoding one.
_PROBE_PROMPTS = ((1, 2, 3, 4, 5), (6, 7, 8))
_PROBE_STEPS = ((9, 10, 11), (12,))


class MlxSequence(MlxModel):
    """One sequence of a parallel MLX model: the loaded weights and tokenizer, with a
    prompt cache of its own. Made by :func:`sequence_views` only."""

    _batcher: ForwardBatcher
    _exchange: RuntimeExchange
    _seq: int
    _head: SequenceHead | None  # type: ignore[assignment]  # the model's head, for this view

    def __init__(self) -> None:  # pragma: no cover - made by sequence_views
        raise TypeError("use sequence_views(model, exchange)")

    @classmethod
    def _of(
        cls, owner: MlxModel, seq: int, batcher: ForwardBatcher, exchange: RuntimeExchange
    ) -> MlxSequence:
        view = cls.__new__(cls)
        # Everything loaded is shared (weights, tokenizer, vocabulary facts); not a
        # method set on the loaded model itself (a test's patch), which would run on
        # its cache. (A tokenizer is callable too: only functions are left out.)
        view.__dict__.update(
            (name, value)
            for name, value in owner.__dict__.items()
            if not isinstance(value, (types.MethodType, types.FunctionType))
        )
        view._seq = seq
        view._batcher = batcher
        view._exchange = exchange
        view._cache = make_prompt_cache(owner._model)
        view._rollback = cache_rollback(view._cache, recurrent=ArraysCache)
        view._tokens = []
        # The loaded head's weights, with a state of this sequence's own (made on the
        # runtime thread: it builds MLX arrays); the capture stays the loaded model's.
        head = owner._head
        view._head = (
            None if head is None else SequenceHead(exchange.call(head.for_sequence), exchange)
        )
        view._head_capture = None
        # Rows are sampled on the host: device sampling would compute with MLX on the
        # generation's own thread, beside the runtime thread's forwards.
        view.device_sampling = False
        return view

    def sequence_head(self) -> SequenceHead | None:
        """This sequence's state of the model's draft head (None: none is attached), its
        work done on the runtime thread; the slot's head drafter drafts with it."""
        return self._head

    def generating(self, active: bool) -> None:
        """Say whether a generation runs on this sequence (others' forwards wait for it)."""
        self._batcher.generating(self._seq, active)

    # -- evaluation: through the batcher --------------------------------------

    def prefill(self, tokens: Sequence[int], *, replay: bool = False) -> None:
        """Read ``tokens`` a chunk per forward, taking turns with the others' rounds.

        Under exact output in the chunks the model reads alone (a prompt's rows round
        by the forward they are read in), so the cache is the one it would be alone."""
        self._check_room(len(tokens))
        offset = 0
        while offset < len(tokens):
            size = PREFILL_CHUNK if self.exact_output else self._batcher.prompt_chunk(self._seq)
            chunk = list(tokens[offset : offset + size])
            self._check_ids(chunk)
            self._batcher.forward(
                self._seq,
                self._cache,
                chunk,
                logits=False,
                head=self._head,
                start=len(self._tokens),
            )
            self._tokens.extend(chunk)
            offset += len(chunk)

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` in one forward (shared with the others' rounds); float32
        logits, one row per token."""
        if not tokens:
            raise ValueError("forward needs at least one token")
        self._check_room(len(tokens))
        if last_only and len(tokens) > 1:
            self.prefill(tokens[:-1])
            tokens = tokens[-1:]
        chunk = list(tokens)
        self._check_ids(chunk)
        rows = self._batcher.forward(
            self._seq, self._cache, chunk, logits=True, head=self._head, start=len(self._tokens)
        )
        self._tokens.extend(chunk)
        assert rows is not None
        return rows

    def _check_ids(self, tokens: Sequence[int]) -> None:
        # MLX gathers embeddings without bounds checks: a bad id would crash the process.
        if min(tokens) < 0 or max(tokens) >= self.n_vocab:
            raise DecodeError(f"token ids must lie in [0, {self.n_vocab}); got {list(tokens)}")

    # -- the rest of the MLX work: on the runtime thread ----------------------
    # (rollback only moves the KV caches' offsets: host bookkeeping, on this thread;
    # the head's cut is noted and made on the runtime thread, backends/sequence_head.py)

    def save_state(self) -> SequenceState:
        """A copy of this sequence's cache (any view of the model may restore it)."""
        return self._exchange.call(lambda: MlxModel.save_state(self))

    def restore_state(self, state: SequenceState) -> None:
        """Put a state saved by a view of this model back, replacing this sequence's."""
        self._exchange.call(lambda: MlxModel.restore_state(self, state))

    def read_state(self, tokens: Sequence[int], file: BinaryIO, nbytes: int) -> SequenceState:
        """A state from a file (its arrays are built on the runtime thread)."""
        return self._exchange.call(lambda: MlxStateFiles.read_state(self, tokens, file, nbytes))

    def close(self) -> None:
        """Nothing of its own to free but the cache and the head's state: the loaded
        model owns the weights (and the head's)."""
        self._cache = []
        self._head = None


@dataclass
class SequenceViews:
    """A parallel model's views and the batcher they share."""

    views: list[MlxSequence]
    batcher: ForwardBatcher
    exchange: RuntimeExchange

    def close(self) -> None:
        """Stop batching for the model (before it is freed)."""
        self.exchange.remove_batcher(self.batcher)


def sequence_views(model: MlxModel, exchange: RuntimeExchange) -> SequenceViews:
    """One view per sequence of ``model`` (loaded with ``parallel``), batched on
    ``exchange``; the probe that decides how rounds gather runs on the runtime thread."""
    if model.parallel < 2:
        raise ValueError(f"{model.name} was loaded with one sequence; load it with parallel")
    if model.recurrent:
        raise BackendError(f"{model.name} has recurrent layers: its sequences run one at a time")
    plain = all(isinstance(layer, KVCache) for layer in make_prompt_cache(model._model))
    batcher = ForwardBatcher(
        model._model,
        name=model.name,
        condition=exchange.condition,
        gathers=plain and gathers_attention(model._model),
        arriving=lambda: exchange.arriving(),
        capture=model._head_capture,
    )
    if batcher.gathers:
        exact = exchange.call(lambda: rounds_as_alone(model._model))
        batcher.gathers, batcher.batch_exact = exact is not None, bool(exact)
    views = [MlxSequence._of(model, seq, batcher, exchange) for seq in range(model.parallel)]
    model.rollback(0)  # the loaded model's own cache is not a sequence: drop calibration's
    exchange.add_batcher(batcher)
    return SequenceViews(views, batcher, exchange)


def rounds_as_alone(model: Any) -> bool | None:
    """Whether a gathered forward's rows are, bit for bit, the rows each sequence
    gets alone (measured: the matmuls' kernels may add up B*L rows in another order);
    None where a gathered forward fails or is far from alone (a family that reads its
    cache in a way batched_forward.py does not serve): its sequences run in turn."""
    alone = [_probe_rows(model, [index])[0] for index in range(len(_PROBE_PROMPTS))]
    try:
        together = _probe_rows(model, list(range(len(_PROBE_PROMPTS))))
    except Exception:  # a family not built for it: in turn, never wrong
        return None
    # Rounding moves a row's logits by a little; a family whose positions or masks
    # went wrong moves them all by a lot.
    pairs = list(zip(alone, together, strict=True))
    if any(np.abs(a - b).mean() > 0.05 * a.std() for a, b in pairs):
        return None
    return all(np.array_equal(a, b) for a, b in pairs)


def _probe_rows(model: Any, which: list[int]) -> list[np.ndarray]:
    caches = []
    for index in which:
        cache = make_prompt_cache(model)
        model(mx.array([_PROBE_PROMPTS[index]], dtype=mx.int32), cache=cache)
        mx.eval([layer.state for layer in cache])
        caches.append(cache)
    steps = [list(_PROBE_STEPS[index]) for index in which]
    if len(which) == 1:
        out = model(mx.array(steps, dtype=mx.int32), cache=caches[0])
    else:
        out = forward_together(model, caches, steps)
    rows = [out[row, : len(step)].astype(mx.float32) for row, step in enumerate(steps)]
    mx.eval(rows)
    return [np.array(row) for row in rows]
