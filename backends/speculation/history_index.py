"""An index of earlier token streams (replies, prompts' new parts) that drafts come from.

An agent's sessions repeat each other: the same file written again after a failed
test, the same scaffold in every new project, the same answer in a new conversation.
A new session's prompt does not hold the last session's replies, so prompt lookup
cannot draft them; this index can (suffix decoding: Oliaro et al., NeurIPS 2025).

The structure is compact and bounded: a ring of ``capacity`` tokens (int32) holding
the streams one after another, each closed by a separator, and for each of two
*anchor* lengths (a long and a short n-gram) LZ77's hash chains: a table from an
n-gram's hash to the latest position where it ends, and per position the previous
position whose n-gram hashed alike. Adding a stream is a few vectorized numpy
operations; the oldest tokens are overwritten when the ring is full, and a chain
stops where it reaches them.

A lookup hashes the context's last n tokens, walks the chain for at most a few dozen
candidates, measures in one vectorized step how far back each one matches the context
(up to :data:`MAX_MATCH` tokens) and what followed it, keeps the deepest matches (as
a suffix tree's deepest matching node), and proposes their most frequent continuation
token by token, stopping where the continuation's share among them falls below
:data:`MIN_SHARE`. A longer, more frequent match is allowed a longer draft.

Everything drafted is verified by the target: what the index holds (another user's
text included) can only speed a reply up, never change it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Closes every stream in the ring; never a token id, so never matched or drafted.
SEPARATOR = -1
# The anchors, longest first: a long anchor finds a long repeat among a flood of
# common short n-grams; the short one finds where a reply rejoins an earlier one.
ANCHORS = (16, 4)
# Candidates a lookup examines per anchor (the most recent first).
CANDIDATES = {16: 16, 4: 32}
# How far back a match is measured: enough to tell a copied stretch from a phrase.
MAX_MATCH = 32
# A draft may be this many times as long as its match (times its support, up to
# MAX_SUPPORT): a long, frequent match is likely a stretch being repeated.
DRAFT_PER_MATCHED_TOKEN = 1
MAX_SUPPORT = 4
# Stop the continuation where fewer than this share of the deepest matches agree.
MIN_SHARE = 0.2
# A lookup offers at most this many other continuations (verified as a tree where a
# batch is cheap: backends/speculation/draft_tree.py).
MAX_ALTERNATIVES = 3
# Drafts are never longer than this (the controller asks for at most 16).
MAX_DRAFT = 64
# Polynomial hashing of n-grams, modulo 2^64 (numpy's uint64 wraps alike).
_MULTIPLIER = 0x100000001B3
_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
# RAM per stored token: the token, two chain links and about two table slots each.
RAM_BYTES_PER_TOKEN = 4 + 2 * 8 + 2 * 2 * 8


@dataclass(frozen=True)
class HistoryMatch:
    """What the index proposes: ``tokens``, after a match of ``length`` tokens that
    ``support`` earlier occurrences share (0 and no tokens: nothing matched)."""

    tokens: list[int]
    length: int
    support: int
    # Other continuations the deepest matches went on with, the likelier first: each a
    # whole branch (it shares ``tokens``' opening up to where it parts).
    alternatives: tuple[tuple[int, ...], ...] = ()


NO_MATCH = HistoryMatch([], 0, 0)


# The smallest index kept, whatever the budget (a few replies).
MIN_CAPACITY = 4096


def capacity_for(budget_bytes: int) -> int:
    """How many tokens an index kept in ``budget_bytes`` of RAM holds (at least
    :data:`MIN_CAPACITY`)."""
    return max(MIN_CAPACITY, budget_bytes // RAM_BYTES_PER_TOKEN)


class HistoryIndex:
    """A bounded ring of earlier token streams with hash chains over their n-grams.

    Thread-safe: streams are added on a background thread while the loop's thread
    looks up; a lookup never waits (it finds nothing while an addition holds the index).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 64:
            raise ValueError("a history index holds at least 64 tokens")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._tokens = np.full(capacity, SEPARATOR, dtype=np.int32)
        self._total = 0  # tokens ever written; positions are absolute, the ring wraps
        self._bits = max(10, (capacity - 1).bit_length())
        self._heads = {n: np.full(1 << self._bits, -1, dtype=np.int64) for n in ANCHORS}
        self._chains = {n: np.full(capacity, -1, dtype=np.int64) for n in ANCHORS}
        self.streams = 0  # streams added (loaded ones count as one)

    def __len__(self) -> int:
        """The tokens held (separators included)."""
        return min(self._total, self.capacity)

    # -- adding -------------------------------------------------------------------

    def add(self, stream: Sequence[int]) -> None:
        """Store one token stream (a reply, a prompt's new part) and index it."""
        if len(stream) < 2:
            return
        data = np.empty(len(stream) + 1, dtype=np.int64)
        data[:-1] = stream
        data[-1] = SEPARATOR
        with self._lock:
            self._append(data)
            self.streams += 1

    def load(self, tokens: np.ndarray) -> None:
        """Store streams as :meth:`stored` returned them (separated), oldest first."""
        data = np.asarray(tokens, dtype=np.int64)
        if data.size and data[-1] != SEPARATOR:
            data = np.append(data, SEPARATOR)
        with self._lock:
            self._append(data)
            self.streams += int(np.count_nonzero(data == SEPARATOR))

    def clear(self) -> None:
        """Forget every stream."""
        with self._lock:
            self._tokens.fill(SEPARATOR)
            for n in ANCHORS:
                self._heads[n].fill(-1)
                self._chains[n].fill(-1)
            self._total = 0
            self.streams = 0

    def stored(self) -> np.ndarray:
        """Every token held, oldest first (int32, separators included): for saving."""
        with self._lock:
            floor = max(0, self._total - self.capacity)
            positions = np.arange(floor, self._total) % self.capacity
            return self._tokens[positions].copy()

    def _append(self, data: np.ndarray) -> None:
        if data.size > self.capacity:
            data = data[-self.capacity :]
        count = int(data.size)
        if count == 0:
            return
        start = self._total
        slots = (start + np.arange(count)) % self.capacity
        self._tokens[slots] = data
        self._total += count
        separators = np.concatenate(([0], np.cumsum(data == SEPARATOR)))
        for n in ANCHORS:
            chain = self._chains[n]
            chain[slots] = -1  # these positions' old links belong to overwritten tokens
            if count < n + 1:
                continue
            ends = np.arange(n - 1, count - 1)
            # An n-gram is indexed where it holds no separator and a token follows it.
            clean = (separators[ends + 1] - separators[ends + 1 - n] == 0) & (
                data[ends + 1] != SEPARATOR
            )
            ends = ends[clean]
            if ends.size == 0:
                continue
            buckets = self._buckets(_window_hashes(data, n)[ends - (n - 1)])
            self._link(n, buckets, start + ends)

    def _link(self, n: int, buckets: np.ndarray, positions: np.ndarray) -> None:
        """Put ``positions`` (ascending) at the head of their buckets' chains."""
        heads, chain = self._heads[n], self._chains[n]
        order = np.argsort(buckets, kind="stable")
        sorted_buckets, sorted_positions = buckets[order], positions[order]
        first = np.ones(sorted_buckets.size, dtype=bool)
        first[1:] = sorted_buckets[1:] != sorted_buckets[:-1]
        last = np.ones(sorted_buckets.size, dtype=bool)
        last[:-1] = first[1:]
        previous = np.empty_like(sorted_positions)
        previous[1:] = sorted_positions[:-1]
        previous[first] = heads[sorted_buckets[first]]
        chain[sorted_positions % self.capacity] = previous
        heads[sorted_buckets[last]] = sorted_positions[last]

    def _buckets(self, hashes: np.ndarray) -> np.ndarray:
        mixed = hashes * np.uint64(_MIX)
        return (mixed >> np.uint64(64 - self._bits)).astype(np.int64)

    # -- looking up ------------------------------------------------------------------

    def lookup(self, context: Sequence[int], max_tokens: int) -> HistoryMatch:
        """The most frequent continuation of the context's deepest earlier match."""
        if max_tokens <= 0 or self._total == 0 or not self._lock.acquire(blocking=False):
            return NO_MATCH
        try:
            tail = [int(token) for token in context[-MAX_MATCH:]]
            for n in ANCHORS:
                if len(tail) < n:
                    continue
                found = self._lookup_anchor(n, tail, min(max_tokens, MAX_DRAFT))
                if found.tokens:
                    return found
            return NO_MATCH
        finally:
            self._lock.release()

    def _lookup_anchor(self, n: int, tail: list[int], max_tokens: int) -> HistoryMatch:
        value = 0
        for token in tail[-n:]:
            value = (value * _MULTIPLIER + token) & _MASK
        bucket = (value * _MIX & _MASK) >> (64 - self._bits)
        floor = max(0, self._total - self.capacity)
        heads, chain = self._heads[n], self._chains[n]
        candidates: list[int] = []
        position = int(heads[bucket])
        while position >= floor and len(candidates) < CANDIDATES[n]:
            candidates.append(position)
            position = int(chain[position % self.capacity])
        if not candidates:
            return NO_MATCH
        ends = np.asarray(candidates, dtype=np.int64)
        width = len(tail)
        back = ends[:, None] - np.arange(width)
        earlier = np.where(back >= floor, self._tokens[back % self.capacity], SEPARATOR)
        equal = earlier == np.asarray(tail[::-1], dtype=np.int64)
        lengths = np.where(equal.all(axis=1), width, equal.argmin(axis=1))
        deepest = int(lengths.max())
        if deepest < n:
            return NO_MATCH  # every candidate was a hash collision
        chosen = ends[lengths == deepest]
        ahead = chosen[:, None] + 1 + np.arange(max_tokens)
        after = np.where(ahead < self._total, self._tokens[ahead % self.capacity], SEPARATOR)
        found = _most_frequent(after, deepest, max_tokens)
        if not found.tokens or after.shape[0] < 2:
            return found
        return dataclasses.replace(found, alternatives=_alternatives(after, found.tokens))


def _alternatives(block: np.ndarray, best: list[int]) -> tuple[tuple[int, ...], ...]:
    """Where rows of ``block`` part from ``best`` inside it, the continuations they go
    on with (as whole branches, ``best``'s opening then theirs, no longer than ``best``),
    most frequent parting first, then the earliest; at most :data:`MAX_ALTERNATIVES`."""
    length = len(best)
    reference = np.asarray(best, dtype=block.dtype)
    differs = block[:, :length] != reference
    parted = differs.any(axis=1)
    found: dict[tuple[int, int], list[int]] = {}
    for row in np.flatnonzero(parted).tolist():
        column = int(differs[row].argmax())
        token = int(block[row, column])
        if token == SEPARATOR:
            continue
        found.setdefault((column, token), []).append(row)
    ranked = sorted(found.items(), key=lambda item: (-len(item[1]), item[0][0], item[1][0]))
    branches: list[tuple[int, ...]] = []
    for (column, _token), rows in ranked[:MAX_ALTERNATIVES]:
        tail = block[rows[0], column:length].tolist()
        stop = tail.index(SEPARATOR) if SEPARATOR in tail else len(tail)
        branches.append((*best[:column], *tail[:stop]))
    return tuple(branches)


def _most_frequent(block: np.ndarray, length: int, max_tokens: int) -> HistoryMatch:
    """The continuation most rows of ``block`` (what followed each deepest match,
    most recent first) share, token by token (ties: the most recent row), cut where its
    share falls below :data:`MIN_SHARE`, at a stream's end, and at ``length`` tokens
    per row that agrees on its first token (up to :data:`MAX_SUPPORT` rows): a long,
    frequent match goes on longer.

    The stretch where every row agrees (a reply stored many times) is read at once;
    rows are counted one column at a time only where they part.
    """
    rows, columns = block.shape
    unanimous_columns = (block == block[0]).all(axis=0)
    unanimous = columns if unanimous_columns.all() else int(unanimous_columns.argmin())
    drafted: list[int] = []
    support, limit = 0, max_tokens
    if unanimous:
        first = block[0, :unanimous].tolist()
        end = first.index(SEPARATOR) if SEPARATOR in first else unanimous
        support = rows
        limit = min(max_tokens, length * DRAFT_PER_MATCHED_TOKEN * min(support, MAX_SUPPORT))
        drafted = first[: min(end, limit)]
        if end < unanimous or len(drafted) >= limit or unanimous == columns:
            return HistoryMatch(drafted, length, support) if drafted else NO_MATCH
    alive = block.tolist()  # every row agrees with what is drafted so far
    share = 1.0
    for column in range(len(drafted), max_tokens):
        counts: dict[int, int] = {}
        for row in alive:
            counts[row[column]] = counts.get(row[column], 0) + 1
        token = max(counts, key=lambda candidate: counts[candidate])  # first of equals
        share *= counts[token] / len(alive)
        if token == SEPARATOR or share < MIN_SHARE:
            break
        if column == 0:
            support = counts[token]
            limit = min(max_tokens, length * DRAFT_PER_MATCHED_TOKEN * min(support, MAX_SUPPORT))
        if column >= limit:
            break
        drafted.append(token)
        alive = [row for row in alive if row[column] == token]
        if len(alive) == 1:
            # One row left: the rest of it, up to its stream's end (no more counting).
            rest = alive[0][column + 1 : limit]
            stop = rest.index(SEPARATOR) if SEPARATOR in rest else len(rest)
            drafted.extend(rest[:stop])
            break
    return HistoryMatch(drafted, length, support) if drafted else NO_MATCH


def _window_hashes(data: np.ndarray, n: int) -> np.ndarray:
    """The hash of every n-gram of ``data``: element i hashes ``data[i : i + n]``."""
    values = data.astype(np.uint64)  # a separator wraps to 2^64 - 1: never indexed anyway
    count = values.size - n + 1
    hashes = np.zeros(count, dtype=np.uint64)
    multiplier = np.uint64(_MULTIPLIER)
    for offset in range(n):
        hashes = hashes * multiplier + values[offset : offset + count]
    return hashes
