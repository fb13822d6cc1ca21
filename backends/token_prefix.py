"""The common prefix of two token sequences: how much of a cache a new context keeps.

Used by everything that keeps model state keyed by tokens (the speculative loop, the
engine's slots, the conversation and prefix caches), so it lives where none of them
has to import another to reach it.
"""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(left: Sequence[int], right: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    limit = min(len(left), len(right))
    # One comparison of the whole prefix settles the usual case (a context that grew
    # by appends); slices only where a sequence is longer, lists compared as lists.
    head_left = left if len(left) == limit else left[:limit]
    head_right = right if len(right) == limit else right[:limit]
    if type(head_left) is type(head_right):
        same = head_left == head_right
    else:
        same = list(head_left) == list(head_right)
    if same:
        return limit
    index = 0
    while index < limit and left[index] == right[index]:
        index += 1
    return index
