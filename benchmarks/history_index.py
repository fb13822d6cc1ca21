"""What does the history index cost: a lookup per round, adding a reply, saving, loading?

Fills a :class:`~backends.speculation.history_index.HistoryIndex` with a synthetic
million tokens (replies of ~500 tokens over a Zipf-like 32k vocabulary, a third of
them near-copies of earlier ones, as an agent's repeated work is), then times:

- ``lookup``: the index alone, for contexts that end inside a stored reply (a hit) and
  for random ones (a miss); inside one reply stored 200 times (every candidate agrees:
  the most frequent continuation's worst case), asking for 16 and for 64 tokens; and
  the n-gram drafter's whole lookup (prompt, index) over a 4,000-token context, as the
  controller calls it once per round;
- ``add``: one 500-token reply (on the engine's background thread, never the request's);
- ``save`` and ``load``: the index's file written and read back, checked, and indexed.

    PYTHONPATH=. python benchmarks/history_index.py [--tokens 1000000] [--json OUT.json]

No model is loaded; the figures are host time only.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time

import numpy as np

from backends.caches.history_file import read_history, write_history
from backends.speculation.history_index import RAM_BYTES_PER_TOKEN, HistoryIndex
from backends.speculation.ngram_drafter import NgramDrafter

VOCAB = 32000
REPLY_TOKENS = 500


def synthetic_replies(total: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Replies of about REPLY_TOKENS tokens; a third repeat an earlier one with edits."""
    replies: list[np.ndarray] = []
    made = 0
    while made < total:
        if replies and rng.random() < 1 / 3:
            reply = replies[int(rng.integers(len(replies)))].copy()
            edits = rng.integers(len(reply), size=8)
            reply[edits] = rng.zipf(1.3, size=8) % VOCAB
        else:
            reply = (rng.zipf(1.3, size=REPLY_TOKENS) % VOCAB).astype(np.int64)
        replies.append(reply)
        made += len(reply) + 1
    return replies


def micro_seconds(samples: list[float]) -> dict[str, float]:
    """Mean, median and 99th percentile, in microseconds."""
    ordered = sorted(samples)
    return {
        "mean_us": round(statistics.fmean(ordered) * 1e6, 2),
        "median_us": round(ordered[len(ordered) // 2] * 1e6, 2),
        "p99_us": round(ordered[int(len(ordered) * 0.99)] * 1e6, 2),
    }


def main() -> None:
    """Build, time, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=3000)
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args()
    rng = np.random.default_rng(55)
    replies = synthetic_replies(args.tokens, rng)
    index = HistoryIndex(args.tokens + len(replies))

    started = time.perf_counter()
    add_times = []
    for reply in replies:
        begin = time.perf_counter()
        index.add(reply.tolist())
        add_times.append(time.perf_counter() - begin)
    build_seconds = time.perf_counter() - started

    hits, misses, drafted = [], [], []
    for _ in range(args.lookups):
        reply = replies[int(rng.integers(len(replies)))]
        cut = int(rng.integers(20, len(reply) - 20))
        context = reply[:cut].tolist()
        begin = time.perf_counter()
        found = index.lookup(context, 16)
        hits.append(time.perf_counter() - begin)
        drafted.append(len(found.tokens))
        noise = (rng.zipf(1.3, size=64) % VOCAB).tolist()
        begin = time.perf_counter()
        index.lookup(noise, 16)
        misses.append(time.perf_counter() - begin)

    # One reply stored 200 times among other replies: every candidate agrees.
    repeated_index = HistoryIndex(index.capacity)
    repeated = replies[0].tolist()
    for number, reply in enumerate(replies):
        repeated_index.add(repeated if number % 10 == 0 else reply.tolist())
    agreeing: dict[int, list[float]] = {16: [], 64: []}
    for wanted, samples in agreeing.items():
        for cut in range(40, min(440, len(repeated) - 20)):
            begin = time.perf_counter()
            repeated_index.lookup(repeated[:cut], wanted)
            samples.append(time.perf_counter() - begin)

    # The drafter's lookup as a round makes it: a 4,000-token context that grows by one
    # token a round (prompt lookup and the index both asked).
    drafter = NgramDrafter(history=index)
    context = np.concatenate([replies[i] for i in range(8)]).tolist()
    drafter.begin(context[:3500])
    rounds = []
    for end in range(3500, 3500 + args.lookups // 3):
        begin = time.perf_counter()
        drafter.lookup(context[:end], 16)
        rounds.append(time.perf_counter() - begin)

    stored = index.stored()
    buffer = io.BytesIO()
    begin = time.perf_counter()
    write_history(buffer, "key", "label", stored)
    save_seconds = time.perf_counter() - begin
    begin = time.perf_counter()
    buffer.seek(0)
    tokens = read_history(buffer, len(buffer.getvalue()), "key")
    loaded = HistoryIndex(index.capacity)
    loaded.load(tokens)
    load_seconds = time.perf_counter() - begin

    figures = {
        "tokens": len(index),
        "replies": len(replies),
        "ram_bytes_estimate": index.capacity * RAM_BYTES_PER_TOKEN,
        "file_bytes": len(buffer.getvalue()),
        "load_average": os.getloadavg()[0],
        "lookup_hit": micro_seconds(hits),
        "lookup_hit_mean_drafted": round(statistics.fmean(drafted), 2),
        "lookup_miss": micro_seconds(misses),
        "lookup_reply_stored_200_times_16": micro_seconds(agreeing[16]),
        "lookup_reply_stored_200_times_64": micro_seconds(agreeing[64]),
        "drafter_round_4k_context": micro_seconds(rounds),
        "add_500_token_reply": micro_seconds(add_times),
        "build_seconds": round(build_seconds, 3),
        "save_seconds": round(save_seconds, 4),
        "load_seconds": round(load_seconds, 3),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
