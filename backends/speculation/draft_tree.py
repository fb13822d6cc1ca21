"""Several continuations verified in one batch: a small tree of one-hot drafts (issue 55
part 4).

Where the history index holds more than one likely continuation of the context, the
branches share their opening and part later. Merged into a trie, they are verified in
one target forward: the runtime evaluates the round's pending token and every node of
the trie, each node attending to the context, the pending token and its own ancestors
only (llama.cpp: a node belongs to the sequence ids of the branches through it, so
shared openings are computed once). The batch's rows are then: row 0 for the pending
token, row ``1 + i`` for node ``i``.

Nodes are laid out depth first, the best branch first: its nodes are rows ``1 .. K``
in order, exactly the batch a single continuation would have been, so a round whose
best branch wins leaves the cache as a chain would (``keep_tree_path``).

Verification is :func:`backends.speculation.verification.verify_tree`; the tree itself
(:class:`~backends.base.DraftTree`) and the runtimes' side (the optional
:class:`~backends.base.VerifiesTrees` capability) live in ``backends/base.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.base import MAX_TREE_BRANCHES, DraftTree


def build_tree(branches: Sequence[Sequence[int]], max_nodes: int) -> DraftTree | None:
    """The trie of ``branches`` (best first), with at most ``max_nodes`` nodes.

    The best branch is kept whole (it is the round's single continuation); each other
    one adds the nodes where it parts from those before it, while they fit. None when
    no other branch adds a node: then the round verifies the best one alone.
    """
    tokens: list[int] = []
    parents: list[int] = []
    members: list[set[int]] = []
    # Nodes are added per branch; batch order (depth first) is worked out after.
    for number, branch in enumerate(branches[:MAX_TREE_BRANCHES]):
        if number and len(tokens) >= max_nodes:
            break
        node = -1
        added = False
        for token in branch:
            child = next(
                (i for i, p in enumerate(parents) if p == node and tokens[i] == token), None
            )
            if child is None:
                if number and len(tokens) >= max_nodes:
                    break
                tokens.append(int(token))
                parents.append(node)
                members.append(set())
                child = len(tokens) - 1
                added = True
            members[child].add(number)
            node = child
        if number and not added:
            # Nothing of its own (a prefix of an earlier branch): not a branch.
            for index in range(len(tokens)):
                members[index].discard(number)
    if not tokens or all(len(m) <= 1 and 0 in m for m in members):
        return None
    return _depth_first(tokens, parents, members)


def _depth_first(tokens: list[int], parents: list[int], members: list[set[int]]) -> DraftTree:
    """The same trie with its nodes in depth-first order (children in order of creation,
    so the best branch's nodes come first) and its branches numbered densely."""
    order: list[int] = []
    stack = [i for i in reversed(range(len(tokens))) if parents[i] == -1]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(i for i in reversed(range(len(tokens))) if parents[i] == node)
    new_index = {old: new for new, old in enumerate(order)}
    numbers = sorted(set().union(*members))
    dense = {number: index for index, number in enumerate(numbers)}
    return DraftTree(
        tokens=tuple(tokens[old] for old in order),
        parents=tuple(-1 if parents[old] < 0 else new_index[parents[old]] for old in order),
        branches=tuple(frozenset(dense[n] for n in members[old]) for old in order),
        width=len(numbers),
    )
