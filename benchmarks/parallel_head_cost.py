"""What a draft head's round costs on one sequence of a parallel llama.cpp target,
beside the same round on a target of one sequence (a benchmark).

Under ``serve --parallel N`` each sequence drafts with a head state of its own, in one
head context shared by the sequences, and every head call that computes is handed to
the runtime thread (``backends/sequence_head.py``) and hands back a copy of its rows
(``finish`` is noted, done before the head's next work). This measures what that adds
to a round's drafting: the hop to the runtime thread and back, per call, and the row
copies.

Writes, with tests/support/ (SmolLM2's tokenizer, random weights): the tiny llama target
of tiny_eagle3.py (4 layers, 64 wide), an EAGLE-3 head and a DFlash head for it, and
the tiny GLM-4.5-style target of tiny_glm4moe.py (2 layers, 128 wide) with its own MTP
block. After a 40-token prompt, each round is timed ``--calls`` times, the ways
alternated:

- EAGLE-3 and MTP: ``start`` and three chain steps (four drafts), then ``finish``;
- DFlash: one block of 7 drafts, then ``finish``;

on the head of a one-sequence target (the whole round handed to the runtime thread in
one call), and on sequence 1's head of a two-sequence target: each call handed over
from this thread, and, for the chains, the whole chain handed over in one trip
(``SequenceHead.within``, as the chain drafter does). One runtime thread computes all
of it.
Random weights say nothing about acceptance; a call's cost depends on shapes. One
llama.cpp thread. Medians (and fastest), with the one-minute load average.

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        python benchmarks/parallel_head_cost.py --out results/FILE.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from backends.base import ChatMessage
from benchmarks.head_forward_cost import timed
from benchmarks.hybrid_loop_cost import machine_line
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tiny_dflash import write_dflash_head
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target
from tests.support.tiny_glm4moe import write_tiny_glm4moe

PROMPT = [ChatMessage("user", "Write a Python function that reverses a list, please.")]


def _round(name: str, head: Any, prompt: list[int]) -> Callable[[], None]:
    """One round's drafting with ``head`` after ``prompt`` (a token pending)."""
    context = [*prompt, prompt[-1]]
    evaluated = len(prompt)
    if name != "dflash":  # a chain: EAGLE-3's, an MTP head's

        def chain() -> None:
            head.start(evaluated, context)
            for token in prompt[-3:]:
                head.step(token)
            head.finish()

        return chain

    def block() -> None:
        head.draft_block(evaluated, context, 7)
        head.finish()

    return block


def measure(folder: Path, calls: int, threads: int) -> Iterator[tuple[str, list[float]]]:
    """(what, milliseconds per round) for each round measured."""
    from backends.engine import Engine
    from backends.engine_slots import EngineSlots
    from backends.llamacpp.model import LlamaCppModel
    from backends.runtime_exchange import RuntimeExchange

    tokenizer = require_model(SMOLLM2_KEY)
    llama = write_tiny_target(folder / "target.gguf", tokenizer, seed=1)
    # drafter -> (its target, the engine's attach method and the head's file; None: the
    # head is inside the target)
    heads: dict[str, tuple[Path, str | None, Path | None]] = {
        "eagle3": (
            llama,
            "attach_eagle3_head",
            write_eagle3_head(folder / "e3.gguf", llama, seed=2),
        ),
        "dflash": (
            llama,
            "attach_dflash_head",
            write_dflash_head(folder / "df.gguf", llama, seed=2),
        ),
        "mtp": (write_tiny_glm4moe(folder / "glm.gguf", tokenizer, seed=1), None, None),
    }
    # One runtime thread computes everything, as in the engine's process (llama.cpp's
    # threads slow down once a second thread of the process computes).
    exchange = RuntimeExchange()
    stop = threading.Event()
    runtime = threading.Thread(target=exchange.serve, args=(stop,), daemon=True)
    runtime.start()
    try:
        for name, (target_path, attach, path) in heads.items():

            def load(  # type: ignore[no-untyped-def]
                parallel: int, target_path=target_path, attach=attach, path=path
            ) -> Engine:
                """The engine on the target of ``parallel`` sequences, its head attached."""
                model = LlamaCppModel(target_path, n_ctx=512, n_threads=threads, parallel=parallel)
                engine = Engine(model)
                if attach is not None:
                    getattr(engine, attach)(path)
                return engine

            alone = exchange.call(lambda load=load: load(1))
            prompt = alone.chat_prompt(PROMPT)[:40]
            exchange.call(lambda alone=alone, prompt=prompt: alone.target.prefill(prompt))
            whole = _round(name, alone.drafter_named(name).head, prompt)  # type: ignore[attr-defined]

            engine = exchange.call(lambda load=load: load(2))
            slots = EngineSlots(engine, exchange)
            slots.take([])
            slot = slots.take([])
            slot.target.prefill(prompt)
            sequence_head = slot.drafter_named(name).head  # type: ignore[attr-defined]
            ways = {
                f"{name}: one sequence, one call a round": lambda whole=whole: exchange.call(whole),
                f"{name}: sequence 1 of 2, a hop a call": _round(name, sequence_head, prompt),
            }
            if name != "dflash":
                # As the chain drafter hands a sequence's chain over (SequenceHead.within).
                ways[f"{name}: sequence 1 of 2, the chain in one hop"] = (
                    lambda sequence_head=sequence_head, prompt=prompt, name=name: (
                        sequence_head.within(lambda head: _round(name, head, prompt)())
                    )
                )
            # Alternated round by round, so that the machine's drift falls on all alike.
            times: dict[str, list[float]] = {what: [] for what in ways}
            for _ in range(calls):
                for what, way in ways.items():
                    times[what].extend(timed(way, 1))
            yield from times.items()
            slots.close()
            exchange.call(engine.close)
            exchange.call(alone.close)
    finally:
        exchange.stop_serving(stop)
        runtime.join(timeout=10)


def report(results: list[tuple[str, list[float]]], loads: list[float], args) -> Iterator[str]:
    """The text report."""
    yield "A draft head's round on one sequence of a parallel target, beside one sequence alone"
    yield machine_line(args.threads)
    yield (
        f"{args.calls} rounds each, after a 40-token prompt; milliseconds, median (fastest); "
        f"one-minute load average {min(loads):.1f}-{max(loads):.1f}"
    )
    yield (
        "RANDOM WEIGHTS: nothing here says anything about acceptance. Shapes: target llama "
        "4 x 64; EAGLE-3 head 1 x 64 (4 drafts: start + 3 steps), DFlash head 2 x 64 (7 "
        "drafts, one block); both borrow the 49,152-token LM head. MTP: target glm4moe "
        "2 x 128, its nextn block 1 x 128 with 4 experts (4 drafts: start + 3 steps)."
    )
    yield ""
    yield f"{'round':<48} {'ms':>17} {'x alone':>8}"
    alone = 0.0
    for what, times in results:
        if "one sequence" in what:
            alone = statistics.median(times)
        cell = f"{statistics.median(times):.3f} ({min(times):.3f})"
        yield f"{what:<48} {cell:>17} {statistics.median(times) / alone:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    results, loads = [], [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as folder:
        for what, times in measure(Path(folder), args.calls, args.threads):
            results.append((what, times))
            loads.append(os.getloadavg()[0])
    lines = list(report(results, loads, args))
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
