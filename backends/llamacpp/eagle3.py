"""An EAGLE-3 head (llama.cpp's ``eagle3`` architecture) drafting for a llama.cpp target.

An EAGLE-3 head is one small decoder block trained beside a target. It reads, for each
position ``p`` of the conversation, the inputs of three of the target's layers there
(``f_p``, concatenated: low, middle and high features). The head's encoder (``fc``)
projects them to ``g_p``; its decoder entry at position ``p`` reads the embedding of
the token after it, ``t_{p+1}``, beside ``g_p`` and predicts ``t_{p+2}``. Chained on
its own pre-norm output ``h'`` in place of ``g`` it drafts several tokens.

The bookkeeping, for a target that has evaluated positions ``0..n-1`` (its cache) and
whose next token ``t_n`` is pending:

- the target context extracts its layers' inputs (``llama_set_embeddings_layer_inp``)
  and every target decode leaves one feature row ``f_p`` per position; they are kept
  here until the head has used them;
- catching up encodes the kept rows of the positions the target accepted since the
  last round and adds the decoder entries ``(t_{p+1}, g_p)`` at ``p``, in one batch;
- the last of them, ``(t_n, g_{n-1})`` at ``n - 1``, gives the first draft's row (both
  are final, so that entry is kept); the chain then adds ``(d_1, h'_{n-1})`` at ``n``,
  and so on; the chained entries are dropped when the chain ends.

A target rollback drops the rows and the head's entries from the cut on. The draft's
``q`` is the head's own distribution (its logits, filtered like the target's), so the
loop accepts by exact rejection sampling.

Loading a head and refusing one trained for another target: ``eagle3_files``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.errors import DecodeError
from backends.llamacpp.eagle3_files import set_layer_input
from backends.llamacpp.head_base import LlamaCppHead, llama_cpp_ext
from backends.llamacpp.library import llama_cpp
from backends.sampling.rows import HostRows

# Target rows waiting beyond this many are read into the head at once (a prompt), so
# the rows kept, three target widths each, stay few.
EAGER_SYNC_ROWS = 64


class LlamaCppEagle3Head(LlamaCppHead):
    """An EAGLE-3 head over a llama.cpp target: follows it and drafts a chain.

    ``weights`` (the head's loaded GGUF, owned and freed here) must have passed
    :func:`~backends.llamacpp.eagle3_files.load_eagle3_weights`'s checks against this target.
    """

    WHAT = "the EAGLE-3 head"
    ENTRY_LAG = 1  # entry p reads the token at p + 1
    CHAINS = True
    KEEP_BEHIND = 64  # a new turn of a chat cuts back a few positions

    def __init__(
        self,
        target_context: Any,
        weights: Any,
        *,
        layer_ids: Sequence[int],
        target_embd: int,
        n_ctx: int,
        n_batch: int,
        threads: int,
        n_vocab: int,
        n_seq: int = 1,
    ) -> None:
        self.layer_ids = tuple(layer_ids)
        self.target_embd = target_embd
        self.n_features = len(self.layer_ids) * target_embd
        super().__init__(
            target_context,
            weights,
            row_width=self.n_features,
            n_ctx=n_ctx,
            n_batch=n_batch,
            threads=threads,
            n_vocab=n_vocab,
            owns_weights=True,
            n_seq=n_seq,
        )
        self.n_embd = int(llama_cpp.llama_model_n_embd(weights))
        for layer in self.layer_ids:
            set_layer_input(target_context, layer, True)
        # The head hands out g (encoder) and h' (decoder) for the rows it outputs.
        llama_cpp_ext.llama_set_embeddings_nextn(self._context, True, True)
        self._encoder = self._new_batch(self.n_features, with_tokens=False)
        self._decoder = self._new_batch(self.n_embd, with_tokens=True)

    # -- following the target --------------------------------------------------------

    def target_decoded(self, start: int, tokens: Sequence[int], first_row: int = 0) -> None:
        """The target evaluated ``tokens`` at positions from ``start``, rows from
        ``first_row`` of its batch (a parallel context's holds other sequences' too):
        keep their features."""
        if not self._keep_layer_inputs(start, tokens, first_row):
            return
        if self._kept.end - 1 - self.synced > EAGER_SYNC_ROWS:
            # Entry p reads t_{p+1}: the last row waits for the token after it.
            self._sync(self._kept.end - 1)

    # -- drafting ---------------------------------------------------------------------

    def start(self, evaluated: int, context: Sequence[int]) -> HostRows | None:
        """Catch up with the target, which has evaluated ``context[:evaluated]``, up to
        the entry that reads the pending token ``context[evaluated]``, and chain any
        tokens after it (forced ones); the row for the first free draft, or None where
        the target's features before the pending token are not at hand."""
        if evaluated < 1 or evaluated >= len(context):
            return None
        if not self._kept.holds(evaluated - 1):
            return None
        # A chain left over, or the pending token's entry from an earlier proposal.
        self._forget_from(min(self.synced, evaluated - 1))
        # The pending token's entry alone, after the catch-up: its row (and so q) is
        # then computed alike whatever the catch-up held, proposal after proposal.
        self._sync(evaluated - 1, context)
        rows = self._sync(evaluated, context, logits=True)
        self._chain_end = self.synced
        for token in context[evaluated + 1 :]:
            rows = self.step(token)
        return rows

    def step(self, token: int) -> HostRows:
        """Chain one token after the last: the row for the token after it."""
        return self._chain_step(self._decoder, token)

    # -- internals ------------------------------------------------------------------

    def _sync(
        self, end: int, context: Sequence[int] | None = None, *, logits: bool = False
    ) -> HostRows:
        """Add the decoder entries ``(t_{p+1}, g_p)`` for positions up to ``end``.

        ``t_{p+1}`` comes from ``context`` (the committed tokens and the pending one)
        or, without it, from the kept rows' tokens. Positions whose features are gone
        (a state restored whole) are skipped: the head then sees less context, which
        costs acceptance, never correctness. With ``logits``, the last entry's row.
        """
        kept = self._kept
        first = self._readable_from(max(self.synced, kept.start))
        rows = HostRows(np.empty((0, self.n_vocab), dtype=np.float32))
        for chunk in range(first, end, self.n_batch):
            stop = min(chunk + self.n_batch, end)
            if context is not None:
                following = context[chunk + 1 : stop + 1]
            else:
                following = kept.tokens[chunk + 1 - kept.start : stop + 1 - kept.start]
            g = self._encode(kept.between(chunk, stop))
            self._decoder.fill(
                stop - chunk, chunk, g, following, outputs=[stop - chunk - 1], seq=self.seq
            )
            rows = self._run(self._decoder, 1 if logits and stop == end else 0)
        self.synced = max(self.synced, end)
        # Rows before the last entry are no longer needed (that one is read again when
        # a proposal's pending token replaces the token it read).
        kept.drop_before(self.synced - 1)
        return rows

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """``g`` for each row of ``features`` (the head's ``fc``), a copy."""
        count = len(features)
        # The encoder reads no positions, but llama.cpp checks that a batch's continue
        # the head's cache, so they are placeholders from its end.
        after = int(llama_cpp.llama_memory_seq_pos_max(self._memory, self.seq)) + 1
        self._encoder.fill(count, after, features, outputs=range(count), seq=self.seq)
        self._run(self._encoder, 0, encode=True, what="the EAGLE-3 encoder")
        pointer = llama_cpp_ext.llama_get_embeddings_nextn(self._context)
        if not pointer:
            raise DecodeError("llama.cpp gave no encoder output for the EAGLE-3 head")
        return np.ctypeslib.as_array(pointer, shape=(count, self.n_embd)).copy()
