"""Several sequences at once on the MLX runtime, in-process (a benchmark, not a test;
issue 37 part 5).

Loads an MLX model directory twice: once with one sequence, once with ``--sequences``
N (``backends/mlx/sequences.py``), and generates N greedy replies ("Story K: ...",
``--max-tokens`` each): one after another on the single-sequence engine, then all at
once on the parallel engine's slots, with a runtime thread serving their forwards as
``draftpen serve`` does. Prints the throughput of at once over in turn, the share of
target forwards that carried several sequences, and whether every reply equals its
reply in turn. With ``--draft DIR`` the replies speculate with that draft model
(``--draft-tokens`` K); otherwise they decode plainly.

    PYTHONPATH=. python benchmarks/mlx_parallel.py \\
        ~/.cache/draftpen-test-models/mlx/smollm2-135m-instruct-mlx --sequences 4

Figures scatter on a shared machine: compare the ratio, from one run.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from backends.engine import Engine, GenerationRequest
from backends.engine_slots import EngineSlots, generate_on_slot
from backends.mlx.model import MlxModel
from backends.runtime_exchange import RuntimeExchange
from backends.sampling.filters import SamplingParams

TOPICS = ("a lighthouse", "a lost key", "a quiet robot", "the last train", "a paper boat")


def _engine(target: Path, draft: Path | None, parallel: int, exact: bool) -> Engine:
    def load(path: Path) -> MlxModel:
        return MlxModel(path, n_ctx=1024, parallel=parallel, exact_output=exact)

    return Engine(load(target), load(draft) if draft is not None else None)


def _request(engine: Engine, index: int, args: argparse.Namespace) -> GenerationRequest:
    prompt = f"Story {index}: write a short story about {TOPICS[index % len(TOPICS)]}."
    return GenerationRequest(
        tuple(engine.text_prompt(prompt)),
        params=SamplingParams(temperature=0.0),
        max_tokens=args.max_tokens,
        drafter="model" if args.draft is not None else "none",
        draft_tokens=args.draft_tokens,
        exact=args.exact,
    )


def in_turn(args: argparse.Namespace) -> tuple[float, list[list[int]]]:
    """Seconds for the N replies one after another, and the replies."""
    engine = _engine(args.target, args.draft, 1, args.exact)
    list(engine.generate(_request(engine, 99, args)))  # warm-up
    started = time.perf_counter()
    replies = []
    for index in range(args.sequences):
        events = engine.generate(_request(engine, index, args))
        replies.append([token for event in events for token in event.tokens])
    seconds = time.perf_counter() - started
    engine.close()
    return seconds, replies


def at_once(args: argparse.Namespace) -> tuple[float, list[list[int]], float]:
    """Seconds for the N replies at once, the replies, and the share of target
    forwards that carried several sequences."""
    engine = _engine(args.target, args.draft, args.sequences, args.exact)
    exchange = RuntimeExchange()
    stop = threading.Event()
    runtime = threading.Thread(target=exchange.serve, args=(stop,), daemon=True)
    runtime.start()
    slots = EngineSlots(engine, exchange)
    replies: list[list[int]] = [[] for _ in range(args.sequences)]

    def run(index: int) -> None:
        slot = slots.take(())
        try:
            request = _request(slot, index, args)
            for event in generate_on_slot(slot, request):
                replies[index].extend(event.tokens)
        finally:
            slots.give_back(slot)

    warm = threading.Thread(target=run, args=(0,))
    warm.start()
    warm.join()
    replies[0] = []
    batcher = slots._target_views.batcher
    before = (batcher.runs, batcher.gathered)
    threads = [threading.Thread(target=run, args=(index,)) for index in range(args.sequences)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    forwards, gathered = batcher.runs - before[0], batcher.gathered - before[1]
    exchange.stop_serving(stop)
    runtime.join()
    slots.close()
    engine.close()
    return seconds, replies, gathered / max(1, forwards)


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="an MLX model directory")
    parser.add_argument("--draft", type=Path, help="an MLX draft model directory")
    parser.add_argument("--draft-tokens", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--exact", action="store_true", help="exact output")
    args = parser.parse_args()
    turn_seconds, turn_replies = in_turn(args)
    once_seconds, once_replies, shared = at_once(args)
    tokens = sum(len(reply) for reply in turn_replies)
    print(f"{args.sequences} replies, {tokens} tokens")
    print(f"in turn: {turn_seconds:.2f} s ({tokens / turn_seconds:.1f} tok/s)")
    print(f"at once: {once_seconds:.2f} s ({tokens / once_seconds:.1f} tok/s)")
    print(f"at once over in turn: {turn_seconds / once_seconds:.2f}x")
    print(f"target forwards carrying several sequences: {shared:.0%}")
    print(f"every reply equals its reply in turn: {once_replies == turn_replies}")


if __name__ == "__main__":
    main()
