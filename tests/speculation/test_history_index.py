"""The index of earlier token streams (issue 55): what it proposes, and its bounds."""

from __future__ import annotations

import numpy as np
import pytest

from backends.speculation.history_index import (
    ANCHORS,
    MAX_MATCH,
    SEPARATOR,
    HistoryIndex,
)

REPLY = list(range(100, 180))


def occurrences(streams: list[list[int]], pattern: list[int]) -> list[tuple[int, int]]:
    """Every (stream, end) where ``pattern`` ends at ``end`` with a token after it."""
    found = []
    size = len(pattern)
    for number, stream in enumerate(streams):
        for end in range(size - 1, len(stream) - 1):
            if stream[end + 1 - size : end + 1] == pattern:
                found.append((number, end))
    return found


def test_a_stored_reply_is_proposed_after_the_context_that_preceded_it() -> None:
    index = HistoryIndex(1000)
    index.add(REPLY)
    found = index.lookup([7, 8, *REPLY[:20]], 10)
    assert found.tokens == REPLY[20:30]
    assert found.length == 20 and found.support == 1


def test_the_most_frequent_continuation_wins_over_the_most_recent() -> None:
    index = HistoryIndex(1000)
    shared = list(range(200, 212))
    index.add([*shared, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    index.add([*shared, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    index.add([*shared, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])  # the latest, alone
    found = index.lookup(shared, 8)
    assert found.tokens == [1] * 8
    assert found.support == 2


def test_a_long_match_drafts_longer_than_a_short_one() -> None:
    index = HistoryIndex(4000)
    index.add(REPLY)
    short = index.lookup([1, 2, 3, *REPLY[10:14]], 40)  # 4 tokens match
    long = index.lookup(REPLY[:40], 40)  # 32 and more match
    assert short.length == 4 and len(short.tokens) == 4
    assert long.length == MAX_MATCH and long.tokens == REPLY[40 : 40 + MAX_MATCH]


def test_a_frequent_match_drafts_longer_than_a_single_one() -> None:
    single, repeated = HistoryIndex(4000), HistoryIndex(4000)
    single.add(REPLY)
    for _ in range(3):
        repeated.add(REPLY)
    context = [1, 2, 3, *REPLY[10:14]]
    assert len(single.lookup(context, 40).tokens) == 4
    found = repeated.lookup(context, 40)
    assert found.support == 3 and found.tokens == REPLY[14:26]


def test_a_continuation_never_runs_past_its_streams_end() -> None:
    index = HistoryIndex(1000)
    index.add(REPLY[:30])
    index.add(list(range(500, 540)))
    found = index.lookup(REPLY[:20], 30)
    assert found.tokens == REPLY[20:30]
    assert SEPARATOR not in found.tokens


def test_nothing_is_proposed_for_a_context_the_index_never_saw() -> None:
    index = HistoryIndex(1000)
    index.add(REPLY)
    assert index.lookup([5, 6, 7, 8, 9, 10], 8).tokens == []
    assert index.lookup(REPLY[:3], 8).tokens == []  # shorter than the shortest anchor
    assert HistoryIndex(1000).lookup(REPLY[:20], 8).tokens == []


def test_the_ring_keeps_the_newest_tokens_and_forgets_the_oldest() -> None:
    index = HistoryIndex(256)
    first = list(range(1000, 1100))
    index.add(first)
    for start in range(2000, 2300, 100):
        index.add(list(range(start, start + 100)))
    assert len(index) == 256
    assert index.lookup(first[:20], 8).tokens == []  # overwritten
    assert index.lookup(list(range(2200, 2220)), 8).tokens == list(range(2220, 2228))


def test_what_is_stored_loads_into_an_index_that_proposes_the_same() -> None:
    rng = np.random.default_rng(3)
    index = HistoryIndex(2000)
    streams = [rng.integers(10, 40, size=120).tolist() for _ in range(30)]
    for stream in streams:
        index.add(stream)
    loaded = HistoryIndex(2000)
    loaded.load(index.stored())
    assert len(loaded) == len(index)
    for stream in streams[-10:]:
        for cut in (8, 30, 70):
            assert loaded.lookup(stream[:cut], 12) == index.lookup(stream[:cut], 12)


@pytest.mark.parametrize("seed", range(6))
def test_every_proposal_followed_a_real_occurrence_of_its_match(seed: int) -> None:
    """Against a brute-force search: what is proposed followed the context's last
    ``length`` tokens somewhere in the stored streams."""
    rng = np.random.default_rng(seed)
    streams = [rng.integers(10, 16, size=int(rng.integers(20, 80))).tolist() for _ in range(20)]
    index = HistoryIndex(10_000)
    for stream in streams:
        index.add(stream)
    for _ in range(40):
        source = streams[int(rng.integers(len(streams)))]
        context = [*rng.integers(10, 16, size=3).tolist(), *source[: int(rng.integers(4, 19))]]
        found = index.lookup(context, 6)
        if not found.tokens:
            continue
        matched = context[-found.length :]
        continuations = [
            streams[number][end + 1 : end + 1 + len(found.tokens)]
            for number, end in occurrences(streams, matched)
        ]
        assert found.tokens in continuations
        assert found.length >= min(ANCHORS)
