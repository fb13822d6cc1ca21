"""The sequences of a parallel llama.cpp context, each a model of its own.

A :class:`~backends.llamacpp.model.LlamaCppModel` loaded with ``parallel`` N holds N
sequences in one KV cache. :func:`sequence_views` makes one
:class:`LlamaCppSequence` per sequence: to the loop it is a model like any other (its
own cached tokens, rollback, saved states, chunked prompt reading), but its decodes
go through the context's :class:`~backends.llamacpp.decode_batcher.DecodeBatcher`, so
the sequences generating at once share each forward, and everything else that touches
the context runs on the runtime thread (``backends/runtime_exchange.py``).

A prompt is handed to the batcher a batch-size at a time, and the batcher reads it in
pieces: about half a second's worth a decode when nothing else runs, and only a few
tokens beside other sequences' rounds or a short prompt (``decode_batcher.py``), so
nobody waits for a long prompt to be read before its next token, and a short prompt
goes before a long one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backends.base import SequenceState
from backends.errors import BackendError, ContextOverflowError, DecodeError
from backends.llamacpp.decode_batcher import DecodeBatcher
from backends.llamacpp.model import LlamaCppModel
from backends.llamacpp.mtp import LlamaCppMtpHead
from backends.runtime_exchange import RuntimeExchange
from backends.sequence_head import SequenceHead


class LlamaCppSequence(LlamaCppModel):
    """One sequence of a parallel context: the loaded model's weights, vocabulary and
    context, with its own cached tokens. Made by :func:`sequence_views` only."""

    _batcher: DecodeBatcher
    _exchange: RuntimeExchange
    _last_logits: np.ndarray
    _remaining: int
    _head: SequenceHead | None  # type: ignore[assignment]  # the model's head, for this view

    def __init__(self) -> None:  # pragma: no cover - made by sequence_views
        raise TypeError("use sequence_views(model, exchange)")

    @classmethod
    def _of(
        cls,
        owner: LlamaCppModel,
        seq: int,
        batcher: DecodeBatcher,
        exchange: RuntimeExchange,
    ) -> LlamaCppSequence:
        view = cls.__new__(cls)
        # Everything loaded is shared (weights, vocabulary, context, token caches); not
        # a method set on the loaded model itself, which would run on its sequence.
        view.__dict__.update(
            (name, value) for name, value in owner.__dict__.items() if not callable(value)
        )
        view._seq = seq
        view._tokens = []
        view._batch = None
        # The loaded model's draft head (an MTP, EAGLE-3 or DFlash head) follows this
        # sequence with a head sequence of its own, fed by the batcher (``decoded``).
        head = owner._head
        view._head = None if head is None else SequenceHead(head.for_sequence(seq), exchange)
        view._recurrent = None
        view._batcher = batcher
        view._exchange = exchange
        view._remaining = 0
        view._last_logits = np.empty((0, owner.n_vocab), dtype=np.float32)
        view.name = owner.name
        return view

    def generating(self, active: bool) -> None:
        """Say whether a generation runs on this sequence (others' decodes wait for it)."""
        self._batcher.generating(self._seq, active)

    # -- evaluation: through the batcher --------------------------------------

    def _decode_at(self, tokens: Sequence[int], start: int, logits_from: int) -> None:
        if not self._context:
            raise DecodeError(f"{self.name} was closed; load the model again to use it")
        count = len(tokens)
        if start + count > self.n_ctx:
            raise ContextOverflowError(
                f"The conversation needs {start + count} tokens but the context holds "
                f"{self.n_ctx}. Start a new chat or raise the context length."
            )
        logits = self._batcher.decode(self._seq, tokens, start, logits_from, self._remaining)
        if logits is not None:
            self._last_logits = logits

    def _logits_view(self, rows: int) -> np.ndarray:
        return self._last_logits[:rows]

    def prefill(self, tokens: Sequence[int]) -> None:
        """Read ``tokens`` alongside the other sequences' rounds, in the pieces the
        batcher chooses.

        Under exact kernels, in the batches the prompt would be read in alone (a
        prompt's rows round by the batch they are in), so the cache is the same."""
        offset = 0
        try:
            while offset < len(tokens):
                chunk = tokens[offset : offset + self.n_batch]
                self._remaining = len(tokens) - offset
                self._decode(chunk, logits_from=len(chunk))
                offset += len(chunk)
        finally:
            self._remaining = 0

    # -- the rest of the context's work: on the runtime thread -----------------

    def rollback(self, n_keep: int) -> None:
        """Forget cached positions from ``n_keep`` on."""
        if n_keep < len(self._tokens):
            self._exchange.call(lambda: LlamaCppModel.rollback(self, n_keep))

    def save_state(self) -> SequenceState:
        """Copy this sequence's cells out (any view of the context may restore it)."""
        return self._exchange.call(lambda: LlamaCppModel.save_state(self))

    def restore_state(self, state: SequenceState) -> None:
        """Put a state saved by a view of this context back, replacing this sequence's."""
        self._exchange.call(lambda: LlamaCppModel.restore_state(self, state))

    def sequence_head(self) -> SequenceHead | None:
        """This sequence's state of the head the loaded model drafts with (None: none),
        its work done on the runtime thread, as the sequence's decodes are."""
        return self._head

    def _head_read(self, start: int, tokens: Sequence[int], first_row: int) -> None:
        """The batcher decoded ``tokens`` from ``start`` for this sequence, from row
        ``first_row`` of its batch: the head keeps its rows (runtime thread)."""
        if self._head is not None:
            self._head.target_decoded(start, tokens, first_row)

    def mtp_head(self) -> SequenceHead | None:  # type: ignore[override]
        """This sequence's state of the loaded model's MTP head (None: it drafts with
        none), its work done on the runtime thread."""
        head = self._head
        return head if head is not None and isinstance(head.head, LlamaCppMtpHead) else None

    def attach_mtp_file(self, path: str | Path) -> None:  # type: ignore[override]
        """Refused: a head is attached to the loaded model, which hands each of its
        sequences a state of it."""
        raise BackendError(
            f"{self.name}: attach the MTP head to the loaded model, not to one of its sequences"
        )

    def close(self) -> None:
        """Nothing of its own to free: the loaded model owns the context."""

    def __del__(self) -> None:
        pass


@dataclass
class SequenceViews:
    """A parallel context's views and the batcher they share."""

    views: list[LlamaCppSequence]
    batcher: DecodeBatcher
    exchange: RuntimeExchange

    def close(self) -> None:
        """Stop batching for the context (before its model is freed)."""
        self.exchange.remove_batcher(self.batcher)
        self.batcher.close()


def sequence_views(model: LlamaCppModel, exchange: RuntimeExchange) -> SequenceViews:
    """One view per sequence of ``model``'s parallel context, batched on ``exchange``.

    Each view starts empty: what the model itself decoded (calibration) is dropped.
    """
    if model.parallel < 2:
        raise ValueError(f"{model.name} was loaded with one sequence; load it with parallel")
    views: list[LlamaCppSequence] = []
    batcher = DecodeBatcher(
        model._live_context(),
        n_batch=model.n_batch,
        name=model.name,
        condition=exchange.condition,
        logits_rows=model._logits_view,
        arriving=lambda: exchange.arriving(),
        decoded=(
            (lambda seq, start, tokens, row: views[seq]._head_read(start, tokens, row))
            if model._head is not None
            else None
        ),
    )
    views += [LlamaCppSequence._of(model, seq, batcher, exchange) for seq in range(model.parallel)]
    # The views start empty: drop what the model itself decoded (calibration).
    model.rollback(0)
    exchange.add_batcher(batcher)
    return SequenceViews(views, batcher, exchange)
