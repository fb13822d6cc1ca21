"""A model's own multi-token-prediction (MTP, "nextn") head, run by llama.cpp.

Qwen3.5/3.6 (and DeepSeek V3, GLM-4.5, ...) ship one extra decoder block that
predicts the token after next: it reads the embedding of a token together with the
target's final hidden state at the position before it, and its own LM-head row is a
distribution over the next token. llama.cpp runs it in a second context of type
``LLAMA_CONTEXT_TYPE_MTP`` on the same weights (or on a separate MTP-only GGUF); that
context keeps a KV cache of its own, one entry per position of the conversation.

The bookkeeping, for a target that has evaluated positions ``0..n-1`` (its cache) and
whose next token ``t_n`` is pending:

- the target context is asked for its hidden states (``llama_set_embeddings_nextn``)
  and every target decode leaves one row ``h_p`` per position; they are kept here
  until the MTP context has used them (a prompt's rows are used a batch at a time);
- the MTP entry at position ``p`` reads ``(t_p, h_{p-1})``: catching up means one
  batch of those for the positions the target accepted since the last round;
- drafting reads ``(t_n, h_{n-1})`` at ``n`` (that entry is kept: both are final),
  then chains on its own: ``(d_1, g_n)`` at ``n + 1`` where ``g`` is the head's own
  hidden state, and so on; the chained entries are dropped when the chain ends.

A target rollback drops the rows and the MTP entries from the cut on. The draft's
``q`` is the head's own distribution (its logits, filtered like the target's), so the
loop accepts by exact rejection sampling.

Gemma 4's MTP head (its "assistant", a separate ``gemma4-assistant`` GGUF) keeps no
cache of its own: llama.cpp links its context to the target's and its layers read the
target's keys and values (its cache's writes and cuts do nothing). So it has nothing
to catch up with: it reads ``(t_n, h_{n-1})`` at ``n`` and chains every step at that
same position, as its publisher's loop (and llama.cpp's) runs it. Its hidden state is
projected back to the target's width (``n_embd_out``), which is what it reads and hands
on; its own layers are narrower.

This module and ``backends/llamacpp*.py`` are the only ones that import ``llama_cpp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from backends.errors import ModelLoadError
from backends.llamacpp.head_base import LlamaCppHead
from backends.llamacpp.library import check_gguf_file
from backends.llamacpp.placement import local_placement
from backends.sampling.rows import HostRows

# Target rows waiting beyond this many are fed to the MTP context at once (a prompt,
# or rounds that drafted otherwise), so the rows kept, and copied, stay few.
EAGER_SYNC_ROWS = 64


class LlamaCppMtpHead(LlamaCppHead):
    """The MTP head of a llama.cpp target: catches up with it and drafts a chain.

    ``weights`` is the llama.cpp model holding the nextn layers: the target's own
    (a GGUF that keeps them) or a separate MTP-only GGUF, which ``owns_weights`` frees.
    """

    WHAT = "the MTP head"
    CHAINS = True
    KEEP_BEHIND = 64  # entry p reads h_{p-1}: a new turn of a chat cuts back a few

    def __init__(
        self,
        target_context: Any,
        weights: Any,
        *,
        n_ctx: int,
        n_batch: int,
        threads: int,
        n_vocab: int,
        owns_weights: bool = False,
        n_seq: int = 1,
        one_cache: bool = True,
    ) -> None:
        self.layers = int(llama_cpp.llama_model_n_layer_nextn(weights))
        # The width of the hidden states it reads and hands on: the target's.
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(weights))
        super().__init__(
            target_context,
            weights,
            row_width=self.n_embd,
            n_ctx=n_ctx,
            n_batch=n_batch,
            threads=threads,
            n_vocab=n_vocab,
            owns_weights=owns_weights,
            context_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP,
            n_seq=n_seq,
            one_cache=one_cache,
        )
        # A head that reads the target's cache (Gemma 4's assistant): llama.cpp links
        # its context to the target's, as the head needs, and to no other head's.
        linked = llama_cpp_ext.llama_get_ctx_other(self._context)
        self.shares_target_cache = bool(linked) and linked == target_context
        # The target hands over its hidden state at every position (all rows: a
        # prompt's too), the head its own at the rows it outputs (for chaining).
        llama_cpp_ext.llama_set_embeddings_nextn(target_context, True, False)
        llama_cpp_ext.llama_set_embeddings_nextn(self._context, True, True)
        # One batch carrying both a token and a hidden state per row.
        self._batch = self._new_batch(self.n_embd, with_tokens=True)

    # -- following the target --------------------------------------------------------

    def target_decoded(self, start: int, tokens: Sequence[int], first_row: int = 0) -> None:
        """The target evaluated ``tokens`` at positions from ``start``, rows from
        ``first_row`` of its batch (a parallel context's holds other sequences' too, in
        the batch's order): keep their hidden states."""
        pointer = llama_cpp_ext.llama_get_embeddings_nextn(self._target_context)
        if not pointer:
            return
        rows = np.ctypeslib.as_array(pointer, shape=(first_row + len(tokens), self.n_embd))
        self._kept.add(start, tokens, rows[first_row:])
        if self._kept.end - self.synced > EAGER_SYNC_ROWS:
            self._sync(self._kept.end)

    # -- drafting ---------------------------------------------------------------------

    def start(self, evaluated: int, context: Sequence[int]) -> HostRows | None:
        """Catch up with the target, which has evaluated ``context[:evaluated]``, and
        read the pending token ``context[evaluated]`` and any tokens after it (forced
        ones); the row for the first free draft, or None where the target's hidden
        state before the pending token is not at hand (then nothing is drafted)."""
        if evaluated >= len(context) or not self._has_row(evaluated - 1):
            return None
        # The pending token's entry from an earlier proposal, or a chain left over.
        self._forget_from(min(self.synced, evaluated))
        self._sync(evaluated)
        self._batch.fill(
            1, evaluated, self._row(evaluated - 1), [context[evaluated]], outputs=[0], seq=self.seq
        )
        rows = self._run(self._batch, 1)
        # (t_n, h_{n-1}) is final: kept (a head on the target's cache keeps nothing, and
        # chains at n).
        self.synced = evaluated if self.shares_target_cache else evaluated + 1
        self._chain_end = self.synced
        for token in context[evaluated + 1 :]:
            rows = self.step(token)
        return rows

    def step(self, token: int) -> HostRows:
        """Chain one token after the last: the row for the token after it."""
        if self.shares_target_cache:
            self._chain_end = self.synced  # every step at the pending token's position
        return self._chain_step(self._batch, token)

    # -- internals ------------------------------------------------------------------

    def _hidden_width(self) -> int:
        return self.n_embd

    def _has_row(self, position: int) -> bool:
        return position < 0 or self._kept.holds(position)

    def _row(self, position: int) -> np.ndarray:
        """``h_position`` as a (1, n_embd) array; zeros before the first position."""
        if position < 0:
            return np.zeros((1, self.n_embd), dtype=np.float32)
        return self._kept.between(position, position + 1)

    def _sync(self, end: int) -> None:
        """Add the MTP entries ``(t_p, h_{p-1})`` for positions up to ``end``.

        Positions whose ``h_{p-1}`` is gone (a state restored whole, rows from before
        the head existed) are skipped: the head then sees less context, which costs
        acceptance, never correctness.
        """
        kept = self._kept
        if self.shares_target_cache:
            # Nothing to catch up with: only the last row is read.
            self.synced = max(self.synced, min(end, kept.end))
            kept.drop_before(self.synced - 1)
            return
        first = self._readable_from(max(self.synced, kept.start + 1 if kept.start > 0 else 0))
        end = min(end, kept.end)
        for chunk in range(first, end, self.n_batch):
            stop = min(chunk + self.n_batch, end)
            offset = chunk - kept.start
            tokens = kept.tokens[offset : offset + stop - chunk]
            hidden = (
                kept.rows[offset - 1 : offset - 1 + stop - chunk]
                if chunk > 0
                else np.vstack([self._row(-1), kept.rows[: stop - chunk - 1]])
            )
            self._batch.fill(stop - chunk, chunk, hidden, tokens, outputs=[], seq=self.seq)
            self._run(self._batch, 0)
        self.synced = max(self.synced, end)
        # Rows before the last synced position are no longer needed.
        kept.drop_before(self.synced - 1)


def load_mtp_weights(path: Path, target: Any, target_name: str, *, gpu_layers: int) -> Any:
    """Load a separate GGUF holding ``target``'s MTP head (this machine's devices alone:
    the head drafts, and drafting never waits on a worker); the caller owns the weights."""
    check_gguf_file(path)
    params = llama_cpp.llama_model_default_params()
    local_placement(gpu_layers).apply(params)
    params.load_mtp = True
    weights = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not weights:
        raise ModelLoadError(f"llama.cpp could not load the MTP head {path}")
    if llama_cpp.llama_model_n_layer_nextn(weights) <= 0:
        llama_cpp.llama_model_free(weights)
        raise ModelLoadError(
            f"{path} holds no MTP head (no nextn layers). Use the MTP GGUF published for "
            f"{target_name}, or --drafter ngram."
        )
    # A head reads (and hands on) hidden states of its target's width: Gemma 4's
    # assistant is narrower inside but declares the target's as its output width.
    head_width = llama_cpp.llama_model_n_embd_out(weights)
    target_width = llama_cpp.llama_model_n_embd_out(target)
    if head_width != target_width:
        llama_cpp.llama_model_free(weights)
        raise ModelLoadError(
            f"{path} is an MTP head for a model of hidden size {head_width}, not "
            f"{target_name} ({target_width}): use the head published for {target_name}."
        )
    return weights
