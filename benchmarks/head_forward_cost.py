"""What one forward of a DFlash or DSpark head costs (one block), beside one forward of
its target and one step of a small draft model, on llama.cpp (a benchmark).

Writes, with tests/support/ (SmolLM2's tokenizer, random weights): the tiny llama
target of tiny_eagle3.py (4 layers, 64 wide), a DFlash and a DSpark head for it
(tiny_dflash.py: 2 layers, block 8, reading 3 of the target's layers), an EAGLE-3 head
(for comparison: one chain step), and two small draft models (the target's shape, and
32 wide). After a 40-token prompt, each call is timed alone, ``--calls`` times:

- the target: a 1-token forward (a plain decoding step) and an 8-token forward (a
  verify of 7 drafts), each rolled back after;
- the draft model: a 1-token step (what a draft model pays per drafted token);
- each block head: ``draft_block`` for the whole block (7 drafts for DFlash, 8 for
  DSpark, whose anchor row drafts too) and for 3 drafts, then ``finish`` (the block's
  entries dropped), the target's features already injected;
- the EAGLE-3 head: one chain step.

Random weights say nothing about acceptance, so nothing about speed-ups; what a call
costs depends on shapes, not weights. Every model here is dominated by its LM head
(49,152 x 64, the target's, which the heads borrow): one output row costs about one
target step, so a block of 8 rows costs about a 8-token verify's output layer. One
llama.cpp thread (on a shared 2-core machine two threads wait on each other). Each
figure is the median (and fastest) of the calls, with the one-minute load average.

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        python benchmarks/head_forward_cost.py --out results/FILE.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from backends.base import ChatMessage
from benchmarks.hybrid_loop_cost import machine_line
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tiny_dflash import BLOCK_SIZE, write_dflash_head
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target

PROMPT = [ChatMessage("user", "Write a Python function that reverses a list, please.")]


def timed(call: Callable[[], object], calls: int) -> list[float]:
    """Milliseconds of each of ``calls`` calls (after one untimed warm-up call)."""
    call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def measure(folder: Path, calls: int, threads: int) -> Iterator[tuple[str, list[float]]]:
    """(what, milliseconds per call) for each call measured."""
    from backends.engine import Engine
    from backends.llamacpp.model import LlamaCppModel

    tokenizer = require_model(SMOLLM2_KEY)
    target_path = write_tiny_target(folder / "target.gguf", tokenizer, seed=1)
    drafts = {
        "draft model (4 x 64): 1-token step": write_tiny_target(
            folder / "draft.gguf", tokenizer, seed=7
        ),
        "draft model (4 x 32): 1-token step": write_tiny_target(
            folder / "narrow-draft.gguf", tokenizer, seed=7, n_embd=32
        ),
    }
    heads = {
        "dflash": write_dflash_head(folder / "dflash.gguf", target_path, seed=2),
        "dspark": write_dflash_head(folder / "dspark.gguf", target_path, seed=2, dspark=True),
    }
    eagle3_path = write_eagle3_head(folder / "eagle3.gguf", target_path, seed=2)

    engine = Engine(LlamaCppModel(target_path, n_ctx=512, n_threads=threads))
    target = engine.target
    prompt = engine.chat_prompt(PROMPT)[:40]
    target.prefill(prompt)

    def forward(count: int) -> Callable[[], object]:
        def call() -> None:
            target.forward(prompt[-count:])
            target.rollback(len(prompt))

        return call

    yield "target: 1-token forward (a plain step)", timed(forward(1), calls)
    yield f"target: {BLOCK_SIZE}-token forward (a verify)", timed(forward(BLOCK_SIZE), calls)

    for what, draft_path in drafts.items():
        draft = LlamaCppModel(draft_path, n_ctx=512, n_threads=threads)
        draft.prefill(prompt)

        def draft_step(draft: LlamaCppModel = draft) -> None:
            draft.forward(prompt[-1:], last_only=True)
            draft.rollback(len(prompt))

        yield what, timed(draft_step, calls)
        draft.close()

    context = [*prompt, prompt[-1]]  # the target has read the prompt; a token is pending
    for name, path in heads.items():
        engine.attach_dflash_head(path)
        head = target._head  # type: ignore[attr-defined]
        target.rollback(0)
        target.prefill(prompt)  # the head keeps the prompt's features (injected at once)
        assert head.draft_block(len(prompt), context, 3) is not None
        head.finish()
        for drafts in (head.max_drafts, 3):

            def block(head: object = head, drafts: int = drafts) -> None:
                head.draft_block(len(prompt), context, drafts)  # type: ignore[attr-defined]
                head.finish()  # type: ignore[attr-defined]

            yield f"{name} head: one block, {drafts} drafts", timed(block, calls)

    engine.attach_eagle3_head(eagle3_path)
    eagle3 = target._head  # type: ignore[attr-defined]
    target.rollback(0)
    target.prefill(prompt)
    assert eagle3.start(len(prompt), context) is not None
    eagle3.finish()

    def chain_step() -> None:
        eagle3.start(len(prompt), context)
        eagle3.step(prompt[-2])
        eagle3.finish()

    start_only = timed(lambda: (eagle3.start(len(prompt), context), eagle3.finish()), calls)
    with_step = timed(chain_step, calls)
    yield "eagle3 head: first draft row (start)", start_only
    yield "eagle3 head: start + one chain step", with_step
    engine.close()


def report(results: list[tuple[str, list[float]]], loads: list[float], args) -> Iterator[str]:
    """The text report."""
    yield "One forward of a DFlash/DSpark head (a block) beside the target and a draft model"
    yield machine_line(args.threads)
    yield (
        f"{args.calls} calls each, after a 40-token prompt; milliseconds, median (fastest); "
        f"one-minute load average {min(loads):.1f}-{max(loads):.1f}"
    )
    yield (
        "RANDOM WEIGHTS: nothing here says anything about acceptance. Shapes: target llama "
        "4 x 64, heads 2 x 64 (block 8), drafts 4 x 64 and 4 x 32; all have or borrow a "
        "49,152-token LM head."
    )
    yield ""
    base = statistics.median(results[0][1])
    yield f"{'call':<44} {'ms':>17} {'x target step':>14}"
    for what, times in results:
        cell = f"{statistics.median(times):.3f} ({min(times):.3f})"
        yield f"{what:<44} {cell:>17} {statistics.median(times) / base:14.2f}"


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
