"""A draft tree verified in one ``llama_decode`` (issue 55 part 4; the tree itself:
``backends/speculation/draft_tree.py``).

llama.cpp lets a token belong to several sequences: its cell then holds all their ids,
and a token attends to the cells of its first sequence id (causally by position). So a
tree of B branches borrows B scratch sequence ids, which never clash with the
context's own sequences (ids ``parallel`` and up; ``n_seq_max`` makes room for them):

- before the batch, each scratch id is given the model's cached cells
  (``llama_memory_seq_cp``: in one KV stream that adds the id to those cells, no copy);
- the pending token belongs to the model's sequence and every scratch id, each node to
  the branches through it: a node sees the context, the pending token and its own
  ancestors, and a shared opening is computed once;
- after verification the model's sequence takes the accepted path's cells
  (``seq_cp`` over their positions) and every scratch id is dropped (``seq_rm``): the
  other nodes' cells are freed, and ``_tokens`` (what the cache holds) gains the path.

This needs one KV stream for all ids (``kv_unified``): with a stream per sequence
``seq_cp`` copies whole streams. A model makes trees only with one sequence of its own
(``--parallel`` 1), no recurrent state (its rollback is by snapshot) and no draft head
(an MTP or EAGLE-3 head follows the target's hidden states along one chain). Under
exact kernels a path that leaves the best branch would keep cells out of position
order (the best branch's nodes lie between), and attention would add them up in another
order than plain decoding: there
the path's cells past where it left the best branch are dropped and read again in order
(one more forward, without logits), so the cache is laid out as a chain's would be.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.base import MAX_TREE_BRANCHES, DraftTree
from backends.errors import DecodeError
from backends.llamacpp.ggml_devices import decode
from backends.llamacpp.library import last_llama_error, llama_cpp

# Scratch sequence ids a model that makes trees reserves (one per branch).
TREE_SEQUENCES = MAX_TREE_BRANCHES
# The most nodes one tree holds (the controller asks for fewer).
MAX_TREE_BATCH = 64


def tree_sequences(recurrent: bool, parallel: int) -> int:
    """How many scratch sequence ids a model reserves for trees (0: it makes none)."""
    return 0 if recurrent or parallel > 1 else TREE_SEQUENCES


class TreeBatch:
    """A ``llama_batch`` whose tokens may each belong to several sequences."""

    def __init__(self, size: int, seqs_per_token: int) -> None:
        self.size = size
        self.batch = llama_cpp.llama_batch_init(size, 0, seqs_per_token)

    def fill(
        self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[Sequence[int]]
    ) -> Any:
        """Put ``tokens`` at ``positions``, token i in the sequences ``seqs[i]``, all
        with logits; the batch to decode."""
        batch = self.batch
        batch.n_tokens = len(tokens)
        for index, (token, position, ids) in enumerate(zip(tokens, positions, seqs, strict=True)):
            batch.token[index] = token
            batch.pos[index] = position
            batch.n_seq_id[index] = len(ids)
            for slot, seq in enumerate(ids):
                batch.seq_id[index][slot] = seq
            batch.logits[index] = 1
        return batch

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            llama_cpp.llama_batch_free(self.batch)


class TreeDecoding:
    """What a :class:`~backends.llamacpp.model.LlamaCppModel` adds to verify trees."""

    # Set by the model: its context, memory, sequence, cached tokens, and how many
    # scratch ids it reserved (``tree_sequences``).
    _context: Any
    _memory: Any
    _seq: int
    _tokens: list[int]
    _tree_seqs: int
    _head: Any  # an MTP or EAGLE-3 head (draft_heads.py), or None
    parallel: int
    exact_kernels: bool
    n_ctx: int
    n_vocab: int
    _tree_batch: TreeBatch | None = None
    _open_tree: tuple[int, DraftTree] | None = None
    # Rounds whose kept path was read again in order (exact kernels; for tests).
    tree_replays: int = 0

    def _logits_view(self, rows: int) -> np.ndarray:  # pragma: no cover - the model's
        raise NotImplementedError

    def _decode_at(self, tokens: Sequence[int], start: int, logits_from: int) -> None:
        raise NotImplementedError  # pragma: no cover - the model's

    @property
    def tree_branches(self) -> int:
        """How many branches a tree may have now (0: this model verifies chains only)."""
        if self._tree_seqs == 0 or self._head is not None or self.parallel > 1:
            return 0
        return self._tree_seqs

    def _scratch(self, branch: int) -> int:
        return self.parallel + branch

    def forward_tree(self, pending: int, tree: DraftTree) -> np.ndarray:
        """Evaluate ``pending`` and the tree's nodes in one ``llama_decode``; their
        logits (row 0: pending, row 1 + i: node i), a view valid until the next call."""
        if not self._context:
            raise DecodeError("the model was closed; load it again to use it")
        if tree.width > self.tree_branches:
            raise ValueError(
                f"a tree of {tree.width} branches; this model takes {self.tree_branches}"
            )
        count = 1 + tree.size
        if count > MAX_TREE_BATCH:
            raise ValueError(f"a tree of {tree.size} nodes; at most {MAX_TREE_BATCH - 1}")
        base = len(self._tokens)
        if base + 1 + max(tree.depths()) > self.n_ctx:
            raise DecodeError("the tree does not fit the context")  # the loop never asks
        if self._tree_batch is None:
            self._tree_batch = TreeBatch(MAX_TREE_BATCH, MAX_TREE_BRANCHES + 1)
        scratch = [self._scratch(branch) for branch in range(tree.width)]
        for seq in scratch:
            llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
            llama_cpp.llama_memory_seq_cp(self._memory, self._seq, seq, -1, -1)
        depths = tree.depths()
        seqs = [[self._seq, *scratch]]
        seqs += [[scratch[b] for b in sorted(members)] for members in tree.branches]
        batch = self._tree_batch.fill(
            [pending, *tree.tokens], [base, *(base + depth for depth in depths)], seqs
        )
        self._open_tree = (base, tree)
        status = decode(self._context, batch, count)
        if status != 0:
            self._drop_scratch(tree.width)
            self._open_tree = None
            raise DecodeError(
                f"llama_decode of a draft tree failed ({status}): {last_llama_error()}"
            )
        self._tokens.append(int(pending))
        return self._logits_view(count)

    def keep_tree_path(self, path: Sequence[int]) -> None:
        """Keep the pending token and the nodes of ``path``; free every other node."""
        if self._open_tree is None:
            raise DecodeError("keep_tree_path without a tree forward before it")
        base, tree = self._open_tree
        self._open_tree = None
        # The path's nodes that lie where a chain's would (the best branch's nodes are
        # the batch's first, in order): kept as they are.
        in_order = 0
        while in_order < len(path) and path[in_order] == in_order:
            in_order += 1
        keep = len(path) if not self.exact_kernels else in_order
        if path:
            branch = min(tree.branches[path[-1]])
            copied = llama_cpp.llama_memory_seq_cp
            copied(self._memory, self._scratch(branch), self._seq, base + 1, base + 1 + keep)
        self._drop_scratch(tree.width)
        tokens = tree.path_tokens(path)
        self._tokens.extend(tokens[:keep])
        if keep < len(path):
            # Read again in order, after the cells kept (no logits are needed).
            self.tree_replays += 1
            self._decode_at(tokens[keep:], base + 1 + keep, len(tokens) - keep)
            self._tokens.extend(tokens[keep:])

    def _drop_scratch(self, width: int) -> None:
        for branch in range(width):
            llama_cpp.llama_memory_seq_rm(self._memory, self._scratch(branch), -1, -1)
