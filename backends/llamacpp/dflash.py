"""A DFlash or DSpark head (llama.cpp's ``dflash`` architecture) drafting for a llama.cpp
target: one forward drafts a whole block.

A DFlash head is a few decoder layers trained beside a target. Its cache holds, for each
position ``p`` the target evaluated, keys and values computed from the inputs of some of
the target's layers there (``f_p``, concatenated): a decode of an embeddings batch of
those rows at their positions projects them (``fc``) and writes them into every layer's
cache (llama.cpp calls it injection). Drafting decodes a block of tokens after them: the
pending token ``t_n`` at ``n`` and mask tokens at ``n + 1 ...``, whose attention reads the
injected entries and the whole block (not causally, unless the head says it was trained
causal); each mask slot's row is a distribution over the token at its position. A DSpark
head adds a Markov head that biases each slot's row by the token before it (its own
argmax chain, computed in the graph) and, sampling from its anchor, reads the anchor's
row too, for the token after it.

The bookkeeping, for a target that has evaluated positions ``0..n-1`` and whose next
token ``t_n`` is pending: the target hands out its layers' inputs at every decode, kept
here until injected; a block injects the accepted positions not yet injected, decodes
``[t_n, forced tokens..., mask...]`` and drops the block's entries when the round ends
(:meth:`finish`). A target rollback drops the rows and the injected entries from the
cut on. Each slot's row is the head's own distribution, so the loop accepts by exact
rejection sampling; rows do not depend on the tokens drafted before them in the block
(DSpark's Markov head conditions on its argmax chain), which rejection sampling allows.

Loading a head and refusing one trained for another target: ``dflash_files``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.llamacpp.dflash_files import BlockHeadFacts
from backends.llamacpp.eagle3_files import set_layer_input
from backends.llamacpp.head_base import LlamaCppHead
from backends.llamacpp.library import llama_cpp
from backends.sampling.rows import HostRows

# Target rows waiting beyond this many are injected at once (a prompt), so the rows
# kept, several target widths each, stay few.
EAGER_SYNC_ROWS = 64


class LlamaCppBlockHead(LlamaCppHead):
    """A DFlash or DSpark head over a llama.cpp target: follows it and drafts blocks.

    ``weights`` (the head's loaded GGUF, owned and freed here) must have passed
    :func:`~backends.llamacpp.dflash_files.load_dflash_weights`'s checks against this
    target; ``facts`` say what its blocks are.
    """

    def __init__(
        self,
        target_context: Any,
        weights: Any,
        facts: BlockHeadFacts,
        *,
        layer_ids: Sequence[int],
        target_embd: int,
        n_ctx: int,
        n_batch: int,
        threads: int,
        n_vocab: int,
        n_seq: int = 1,
    ) -> None:
        self.WHAT = "the DSpark head" if facts.kind == "dspark" else "the DFlash head"
        self.facts = facts
        self.kind = facts.kind
        self.layer_ids = tuple(layer_ids)
        self.target_embd = target_embd
        n_features = len(self.layer_ids) * target_embd
        super().__init__(
            target_context,
            weights,
            row_width=n_features,
            n_ctx=n_ctx,
            n_batch=max(n_batch, facts.block_size),
            threads=threads,
            n_vocab=n_vocab,
            owns_weights=True,
            n_seq=n_seq,
        )
        for layer in self.layer_ids:
            set_layer_input(target_context, layer, True)
        llama_cpp.llama_set_causal_attn(self._context, facts.causal)
        self._inject = self._new_batch(n_features, with_tokens=False)
        self._block = self._new_batch(0, with_tokens=True)

    @property
    def max_drafts(self) -> int:
        """The most tokens one block drafts (the head's trained block)."""
        return self.facts.max_drafts

    # -- following the target --------------------------------------------------------

    def target_decoded(self, start: int, tokens: Sequence[int], first_row: int = 0) -> None:
        """The target evaluated ``tokens`` at positions from ``start``, rows from
        ``first_row`` of its batch (a parallel context's holds other sequences' too):
        keep their features."""
        if not self._keep_layer_inputs(start, tokens, first_row):
            return
        if self._kept.end - self.synced > EAGER_SYNC_ROWS:
            self._sync(self._kept.end)

    # -- drafting ---------------------------------------------------------------------

    def draft_block(self, evaluated: int, context: Sequence[int], drafts: int) -> HostRows | None:
        """Catch up with the target, which has evaluated ``context[:evaluated]``, and
        decode one block: ``context[evaluated:]`` (the pending token and any forced
        after it) then mask tokens. The rows of up to ``drafts`` drafting slots, in
        order, each for the token at the position after the one before (a view valid
        until the head's next decode); None where the head cannot draft here."""
        given = len(context) - evaluated
        anchor_row = 1 if self.facts.anchor_drafts else 0
        drafts = min(drafts, self.facts.block_size - given + anchor_row)
        if given < 1 or drafts < 1 or evaluated < 1:
            return None
        self._forget_from(min(self.synced, evaluated))  # a block left over
        if self.synced < evaluated and not self._kept.holds(evaluated - 1):
            return None  # features before the pending token are gone (a restored cache)
        self._sync(evaluated)
        count = given + drafts - anchor_row
        tokens = [*context[evaluated:], *[self.facts.mask_token] * (count - given)]
        self._block.fill(count, evaluated, tokens=tokens, outputs=range(count), seq=self.seq)
        self._chain_end = evaluated + count  # the block's entries, dropped by finish()
        rows = self._run(self._block, count)
        first = given - anchor_row
        return HostRows(rows.logits[first : first + drafts])

    # -- internals ------------------------------------------------------------------

    def _sync(self, end: int) -> None:
        """Inject the kept features of positions up to ``end`` (those not injected yet).

        Positions whose features are gone (a state restored whole) are skipped: the head
        then sees less context, which costs acceptance, never correctness.
        """
        kept = self._kept
        first = self._readable_from(max(self.synced, kept.start))
        end = min(end, kept.end)
        for chunk in range(first, end, self.n_batch):
            stop = min(chunk + self.n_batch, end)
            self._inject.fill(
                stop - chunk, chunk, kept.between(chunk, stop), outputs=[], seq=self.seq
            )
            self._run(self._inject, 0)
        self.synced = max(self.synced, end)
        kept.drop_before(self.synced)
