"""A fake target that verifies draft trees (``backends/speculation/draft_tree.py``), as
strict as the runtime it stands for: each node's row is computed from the cache, the
pending token and that node's ancestors only; the rows are a view the next call
overwrites; and ``keep_tree_path`` must follow the tree's forward and name a real chain
of its nodes, after which the cache holds exactly the pending token and that chain."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.base import DraftTree
from backends.errors import DecodeError
from tests.support.fakes import HashModel


class TreeHashModel(HashModel):
    """A :class:`HashModel` that also verifies trees of up to ``branches`` branches."""

    def __init__(self, *, branches: int = 4, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.branches = branches
        self.tree_batch_sizes: list[int] = []
        # The last tree forward: where it began and the tree (None: kept or none).
        self._open_tree: tuple[int, DraftTree] | None = None

    @property
    def tree_branches(self) -> int:
        """How many branches a tree may have."""
        return self.branches

    def forward_tree(self, pending: int, tree: DraftTree) -> np.ndarray:
        """Rows for the pending token and every node, each from its own path."""
        if self._open_tree is not None:
            raise DecodeError("a tree's forward must be followed by keep_tree_path")
        if tree.width > self.branches:
            raise DecodeError(f"{tree.width} branches, but this model takes {self.branches}")
        self._check_room([pending, *tree.tokens])
        self.forward_calls += 1
        self.forward_batch_sizes.append(1 + tree.size)
        self.tree_batch_sizes.append(1 + tree.size)
        base = len(self._cache)
        self._cache.append(int(pending))
        self._buffer.fill(np.nan)
        self._buffer[0] = self.logits_for(self._cache)
        for node in range(tree.size):
            self._buffer[1 + node] = self.logits_for([*self._cache, *self._path_to(tree, node)])
        self._open_tree = (base, tree)
        return self._buffer[: 1 + tree.size]

    def keep_tree_path(self, path: Sequence[int]) -> None:
        """Keep the pending token and ``path``'s tokens; forget the other nodes."""
        if self._open_tree is None:
            raise DecodeError("keep_tree_path without a tree forward before it")
        base, tree = self._open_tree
        parent = -1
        for node in path:
            if not 0 <= node < tree.size or tree.parents[node] != parent:
                raise DecodeError(f"{list(path)} is not a chain of the tree's nodes")
            parent = node
        del self._cache[base + 1 :]
        self._cache.extend(tree.tokens[node] for node in path)
        self._open_tree = None

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """As :meth:`HashModel.forward`, refused while a tree awaits its keep."""
        if self._open_tree is not None:
            raise DecodeError("a tree's forward must be followed by keep_tree_path")
        return super().forward(tokens, last_only=last_only)

    def rollback(self, n_keep: int) -> None:
        """As :meth:`HashModel.rollback`, refused while a tree awaits its keep."""
        if self._open_tree is not None:
            raise DecodeError("a tree's forward must be followed by keep_tree_path")
        super().rollback(n_keep)

    @staticmethod
    def _path_to(tree: DraftTree, node: int) -> list[int]:
        tokens: list[int] = []
        while node >= 0:
            tokens.append(tree.tokens[node])
            node = tree.parents[node]
        return tokens[::-1]
