"""How the decodes of sequences generating at once are gathered into batches.

The real :class:`~backends.llamacpp.decode_batcher.DecodeBatcher` and the real
:class:`~backends.runtime_exchange.RuntimeExchange` with their threads; only the
``llama_decode`` at the bottom is replaced by a recorder that hands each request
logits rows naming it, so these run without a model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("backends.llamacpp.library")

from backends.llamacpp.decode_batcher import MIN_BESIDE, DecodeBatcher, DecodeRequest
from backends.runtime_exchange import RuntimeExchange

VOCAB = 4


class Recorded(DecodeBatcher):
    """A batcher whose decode records each batch and answers with rows naming the
    request: row i of sequence s holds [s, start + i, ...]."""

    def __init__(self, exchange: RuntimeExchange, n_batch: int = 64) -> None:
        super().__init__(
            None,
            n_batch=n_batch,
            name="recorded",
            condition=exchange.condition,
            logits_rows=lambda rows: np.zeros((rows, VOCAB), dtype=np.float32),
        )
        self.batches: list[list[tuple[int, int]]] = []  # (seq, tokens) per request
        self.release = threading.Event()
        self.release.set()

    def _decode(self, group: list[DecodeRequest]) -> None:
        self.release.wait(10)
        self.batches.append([(request.seq, len(request.tokens)) for request in group])
        for request in group:
            rows = len(request.tokens) - request.logits_from
            if rows:
                logits = np.zeros((rows, VOCAB), dtype=np.float32)
                logits[:, 0] = request.seq
                logits[:, 1] = np.arange(
                    request.start + request.logits_from, request.start + len(request.tokens)
                )
                request.logits = logits


@pytest.fixture
def exchange() -> Iterator[RuntimeExchange]:
    exchange = RuntimeExchange()
    stop = threading.Event()
    thread = threading.Thread(target=exchange.serve, args=(stop,), daemon=True)
    thread.start()
    yield exchange
    exchange.stop_serving(stop)
    thread.join(5)


def run_at_once(
    work: dict[int, tuple[list[int], int, int]], batcher: Recorded
) -> dict[int, np.ndarray | None]:
    """Each sequence's decode from a thread of its own, all started together."""
    results: dict[int, np.ndarray | None] = {}
    start = threading.Barrier(len(work))

    def decode(seq: int) -> None:
        tokens, position, logits_from = work[seq]
        start.wait()
        results[seq] = batcher.decode(seq, tokens, position, logits_from)

    threads = [threading.Thread(target=decode, args=(seq,)) for seq in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


def gather_while_held(batcher: Recorded, decodes: list[tuple[Any, ...]]) -> None:
    """Hold the runtime in a decode of a sequence that is not generating, let each of
    ``decodes`` (``batcher.decode``'s arguments) arrive from a thread of its own
    meanwhile, then let the runtime go on: they gather, and are batched as they may."""
    batcher.release.clear()
    holder = threading.Thread(target=batcher.decode, args=(3, [0], 0, 0))
    holder.start()
    time.sleep(0.05)
    threads = [threading.Thread(target=batcher.decode, args=arguments) for arguments in decodes]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    batcher.release.set()
    for thread in [holder, *threads]:
        thread.join(10)


def test_the_sequences_generating_share_one_decode_and_each_gets_its_own_rows(
    exchange: RuntimeExchange,
) -> None:
    batcher = Recorded(exchange)
    exchange.add_batcher(batcher)
    for seq in (0, 1, 2):
        batcher.generating(seq, True)
    results = run_at_once({0: ([5], 10, 0), 1: ([6, 7, 8], 20, 0), 2: ([9, 9], 30, 1)}, batcher)
    assert len(batcher.batches) == 1 and sorted(batcher.batches[0]) == [(0, 1), (1, 3), (2, 2)]
    assert results[0] is not None and results[0].tolist() == [[0, 10, 0, 0]]
    assert results[1] is not None and results[1][:, :2].tolist() == [[1, 20], [1, 21], [1, 22]]
    assert results[2] is not None and results[2][:, :2].tolist() == [[2, 31]]


def test_a_lone_sequence_never_waits_and_one_that_stops_generating_is_not_waited_for(
    exchange: RuntimeExchange,
) -> None:
    batcher = Recorded(exchange)
    exchange.add_batcher(batcher)
    batcher.generating(0, True)
    batcher.generating(1, True)
    batcher.generating(1, False)  # its request ended (or was cancelled)
    begun = time.monotonic()
    batcher.decode(0, [1], 0, 0)
    # No grace to wait out: sequence 0 is the only one generating.
    assert batcher.batches == [[(0, 1)]]
    assert time.monotonic() - begun < 1.0


def test_a_sequence_busy_elsewhere_delays_the_others_only_by_the_grace(
    exchange: RuntimeExchange,
) -> None:
    batcher = Recorded(exchange)
    exchange.add_batcher(batcher)
    batcher.generating(0, True)
    batcher.generating(1, True)  # generating, but never decodes here
    batcher.decode(0, [1], 0, 0)
    batcher.decode(0, [2], 1, 0)
    assert batcher.batches == [[(0, 1)], [(0, 1)]]


def test_under_exact_kernels_a_batch_stays_within_the_exact_size_and_a_prompt_chunk_goes_alone(
    exchange: RuntimeExchange,
) -> None:
    batcher = Recorded(exchange)
    batcher.exact_limit = 4
    exchange.add_batcher(batcher)
    for seq in (0, 1, 2):
        batcher.generating(seq, True)
    gather_while_held(
        batcher,
        [(0, [1, 2, 3], 5, 0), (1, [4], 5, 0), (2, list(range(40)), 0, 40)],  # 2: a prompt
    )
    gathered = batcher.batches[1:]
    assert sorted(map(sorted, gathered)) == [[(0, 3), (1, 1)], [(2, 40)]]
    assert all(sum(tokens for _, tokens in batch) <= 4 for batch in gathered if len(batch) > 1)


def test_without_exact_kernels_a_prompt_chunk_rides_with_the_others_rounds(
    exchange: RuntimeExchange,
) -> None:
    batcher = Recorded(exchange)
    exchange.add_batcher(batcher)
    batcher.generating(0, True)
    batcher.generating(1, True)
    results = run_at_once({0: ([1], 7, 0), 1: (list(range(32)), 0, 32)}, batcher)
    assert sorted(batcher.batches[0]) == [(0, 1), (1, 32)]
    assert results[1] is None  # a prompt chunk asks for no logits


def test_a_failed_decode_fails_every_request_in_it_and_the_runtime_goes_on(
    exchange: RuntimeExchange,
) -> None:
    class Failing(Recorded):
        def _decode(self, group: list[DecodeRequest]) -> None:
            if len(self.batches) == 0:
                self.batches.append([])
                raise RuntimeError("the runtime refused the batch")
            super()._decode(group)

    batcher = Failing(exchange)
    exchange.add_batcher(batcher)
    batcher.generating(0, True)
    with pytest.raises(RuntimeError, match="refused"):
        batcher.decode(0, [1], 0, 0)
    assert batcher.decode(0, [1], 0, 0) is not None


def test_a_short_prompt_is_read_before_the_rest_of_a_long_one_beside_the_rounds(
    exchange: RuntimeExchange,
) -> None:
    batcher = Recorded(exchange, n_batch=256)
    exchange.add_batcher(batcher)
    for seq in (0, 1, 2):
        batcher.generating(seq, True)
    gather_while_held(
        batcher,
        [
            (0, [1] * 200, 0, 200, 2000),  # an agent's prompt, handed over a batch-size
            (1, [2] * 39, 0, 39, 39),  # a short chat's
            (2, [3], 9, 0),  # a round
        ],
    )
    # The round and the short prompt whole, and only a few of the agent's tokens; then
    # the rest of the agent's prompt, alone, a chunk a batch, until all of it is read.
    assert sorted(batcher.batches[1]) == [(0, MIN_BESIDE), (1, 39), (2, 1)]
    rest = batcher.batches[2:]
    assert all(len(batch) == 1 and batch[0][0] == 0 for batch in rest)
    assert sum(batch[0][1] for batch in rest) == 200 - MIN_BESIDE


def test_beside_a_decoding_sequence_a_long_prompt_reads_a_few_tokens_a_round(
    exchange: RuntimeExchange,
) -> None:
    batcher = Recorded(exchange, n_batch=256)
    exchange.add_batcher(batcher)
    batcher.generating(0, True)
    batcher.generating(1, True)
    prompt = threading.Thread(target=batcher.decode, args=(0, [1] * 100, 0, 100, 3000))
    prompt.start()
    for position in range(5):  # a chat's rounds, one after another
        assert batcher.decode(1, [2], 40 + position, 0) is not None
    prompt.join(10)
    with_the_rounds = [batch for batch in batcher.batches if (1, 1) in batch]
    assert len(with_the_rounds) == 5
    # Nothing measured yet: MIN_BESIDE of the prompt beside each round, never a chunk.
    assert all(dict(batch).get(0, 0) <= MIN_BESIDE for batch in with_the_rounds)
    assert sum(dict(batch).get(0, 0) for batch in batcher.batches) == 100


def test_a_failed_piece_fails_the_whole_prompt_chunk(exchange: RuntimeExchange) -> None:
    class FailingFirst(Recorded):
        def _decode(self, group: list[DecodeRequest]) -> None:
            super()._decode(group)
            if len(self.batches) == 1:
                raise RuntimeError("no room in the KV cache")

    batcher = FailingFirst(exchange, n_batch=256)
    exchange.add_batcher(batcher)
    batcher.generating(0, True)
    chunk = batcher.prompt_chunk()
    with pytest.raises(RuntimeError, match="no room"):
        batcher.decode(0, [1] * (3 * chunk), 0, 3 * chunk, 3 * chunk)
    # Read in pieces: the chunk failed with its first, and the rest was never read.
    assert batcher.batches == [[(0, chunk)]]
    assert batcher.decode(0, [1], 0, 0) is not None


def test_while_another_sequence_generates_a_long_prompt_reads_a_few_tokens_a_batch(
    exchange: RuntimeExchange,
) -> None:
    batcher = Recorded(exchange, n_batch=256)
    exchange.add_batcher(batcher)
    batcher.generating(0, True)
    batcher.generating(1, True)  # a chat setting up: its calls wait for the batch running
    batcher.decode(0, [1] * 40, 0, 40, 3000)
    assert batcher.batches == [[(0, MIN_BESIDE)]] * (40 // MIN_BESIDE)
    batcher.generating(1, False)  # alone again: whole chunks
    batcher.decode(0, [1] * 40, 40, 40, 2960)
    assert batcher.batches[-1] == [(0, 40)]


def test_while_a_request_is_arriving_a_long_prompt_reads_a_few_tokens_a_batch(
    exchange: RuntimeExchange,
) -> None:
    arriving = threading.Event()
    arriving.set()  # the engine's queue says a request is on its way to a free slot
    batcher = Recorded(exchange, n_batch=256)
    batcher._arriving = arriving.is_set
    exchange.add_batcher(batcher)
    batcher.generating(0, True)
    batcher.decode(0, [1] * 12, 0, 12, 3000)
    assert batcher.batches == [[(0, MIN_BESIDE)]] * 3
    arriving.clear()  # it took its slot, or went away
    batcher.decode(0, [1] * 12, 12, 12, 2988)
    assert batcher.batches[-1] == [(0, 12)]
