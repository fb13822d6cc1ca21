"""What EAGLE-3 and DFlash heads cost on MLX, beside the target and a draft model (a
benchmark): one call of each, and the loop's host time per token around each drafter.

Writes, with tests/support/tiny_mlx_heads.py (SmolLM2's tokenizer, random weights): a
four-layer llama target 64 wide, an EAGLE-3 head (one layer) and a DFlash head (two
layers, block 8) for it, and a draft model of the target's shape. On MLX's CPU build
(Linux), float32, after a 40-token prompt:

- each call timed alone, ``--calls`` times: the target's 1-token forward (a plain step)
  and 5-token forward (a verify of 4 drafts), a draft model's 1-token step, the EAGLE-3
  head's first row (``start``: the accepted position read, then the pending token) and
  one chain step, and a DFlash block of 4 and of 7 drafts;
- whole replies (greedy, 64 tokens, 4 drafts a round) with each drafter fixed: tokens
  per second and the loop's host milliseconds per token (``host_seconds``: the reply's
  time less the runtime's calls; on MLX the runtime's time includes evaluating the
  lazy graph each call builds).

Random weights say nothing about acceptance, so nothing about speed-ups: every drafter
here is rejected almost always, which is the loop's most expensive case (a rollback
every round). What matters on a fast GPU is the host time per token, which these tiny
shapes put in the foreground. Medians (and fastest) of the calls, with the one-minute
load average.

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        python benchmarks/mlx_head_cost.py --out results/FILE.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from backends.base import ChatMessage
from benchmarks.head_forward_cost import timed
from benchmarks.hybrid_loop_cost import machine_line
from tests.support.tiny_mlx_heads import write_dflash_head, write_eagle3_head, write_mlx_target

PROMPT = [ChatMessage("user", "Write a Python function that reverses a list, please.")]


def call_costs(files: dict[str, Path], calls: int) -> Iterator[tuple[str, list[float]]]:
    """(what, milliseconds per call) for each call measured."""
    from backends.engine import Engine
    from backends.mlx.model import MlxModel

    engine = Engine(MlxModel(files["target"], n_ctx=512))
    target = engine.target
    prompt = engine.chat_prompt(PROMPT)[:40]
    target.prefill(prompt)

    def forward(count: int):
        def call() -> None:
            target.forward(prompt[-count:])
            target.rollback(len(prompt))

        return call

    yield "target: 1-token forward (a plain step)", timed(forward(1), calls)
    yield "target: 5-token forward (a verify)", timed(forward(5), calls)

    draft = MlxModel(files["draft"], n_ctx=512)
    draft.prefill(prompt)

    def draft_step() -> None:
        draft.forward(prompt[-1:], last_only=True)
        draft.rollback(len(prompt))

    yield "draft model (4 x 64): 1-token step", timed(draft_step, calls)
    draft.close()

    context = [*prompt, prompt[-1]]  # the target has read the prompt; a token is pending
    engine.attach_eagle3_head(files["eagle3"])
    eagle3 = target._head  # type: ignore[attr-defined]
    target.rollback(0)
    target.prefill(prompt)

    def start() -> None:
        rows = eagle3.start(len(prompt), context)
        rows.greedy(0)  # the loop reads the row: its graph is evaluated
        eagle3.finish()

    def start_and_step() -> None:
        eagle3.start(len(prompt), context)
        eagle3.step(prompt[-2]).greedy(0)
        eagle3.finish()

    yield "eagle3 head: first draft row (start)", timed(start, calls)
    yield "eagle3 head: start + one chain step", timed(start_and_step, calls)

    engine.attach_dflash_head(files["dflash"])
    block_head = target._head  # type: ignore[attr-defined]
    target.rollback(0)
    target.prefill(prompt)
    for drafts in (4, block_head.max_drafts):

        def block(drafts: int = drafts) -> None:
            rows = block_head.draft_block(len(prompt), context, drafts)
            rows.greedy(0)
            block_head.finish()

        yield f"dflash head: one block, {drafts} drafts", timed(block, calls)
    engine.close()


def reply_costs(files: dict[str, Path], replies: int) -> Iterator[tuple[str, float, float]]:
    """(drafter, tokens per second, host milliseconds per token), medians of replies."""
    from backends.engine import Engine, GenerationRequest
    from backends.mlx.model import MlxModel

    for drafter in ("none", "model", "eagle3", "dflash"):
        draft = MlxModel(files["draft"], n_ctx=512) if drafter == "model" else None
        engine = Engine(MlxModel(files["target"], n_ctx=512), draft)
        if drafter == "eagle3":
            engine.attach_eagle3_head(files["eagle3"])
        elif drafter == "dflash":
            engine.attach_dflash_head(files["dflash"])
        request = GenerationRequest(
            prompt_tokens=tuple(engine.chat_prompt(PROMPT)),
            max_tokens=64,
            drafter=drafter,
            draft_tokens=4,
        )
        speeds, hosts = [], []
        for _ in range(replies + 1):
            stats = list(engine.generate(request))[-1].stats
            speeds.append(stats.generated_tokens / stats.decode_seconds)
            hosts.append(stats.host_ms_per_token)
        engine.close()
        yield drafter, statistics.median(speeds[1:]), statistics.median(hosts[1:])


def mlx_machine_line() -> str:
    """The CPU, mlx's and mlx-vlm's versions and draftpen's commit."""
    from importlib import metadata

    cpu, _, rest = machine_line(0).partition("; llama-cpp-python")
    commit = rest.rpartition("; ")[2]
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in ("mlx", "mlx-vlm"))
    return f"{cpu}; {versions}; {commit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--replies", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        files = {
            "target": write_mlx_target(folder / "target", seed=1),
            "draft": write_mlx_target(folder / "draft", seed=7),
            "eagle3": write_eagle3_head(folder / "eagle3", seed=2),
            "dflash": write_dflash_head(folder / "dflash", seed=2),
        }
        results = list(call_costs(files, args.calls))
        loads.append(os.getloadavg()[0])
        replies = list(reply_costs(files, args.replies))
        loads.append(os.getloadavg()[0])
    lines = [
        "EAGLE-3 and DFlash heads on MLX (CPU build, float32) beside the target and a draft",
        mlx_machine_line(),
        f"one-minute load average {min(loads):.1f}-{max(loads):.1f}",
        "RANDOM WEIGHTS: nothing here says anything about acceptance. Shapes: target llama "
        "4 x 64, EAGLE-3 head 1 x 64, DFlash head 2 x 64 (block 8), draft 4 x 64; all "
        "have or borrow a 49,152-token LM head.",
        "",
        f"{args.calls} calls each; milliseconds, median (fastest)",
    ]
    base = statistics.median(results[0][1])
    lines.append(f"{'call':<44} {'ms':>17} {'x target step':>14}")
    for what, times in results:
        cell = f"{statistics.median(times):.3f} ({min(times):.3f})"
        lines.append(f"{what:<44} {cell:>17} {statistics.median(times) / base:14.2f}")
    lines += ["", f"replies of 64 tokens, greedy, 4 drafts a round; medians of {args.replies}"]
    lines.append(f"{'drafter':<10} {'tok/s':>8} {'host ms/token':>14}")
    for drafter, speed, host in replies:
        lines.append(f"{drafter:<10} {speed:8.1f} {host:14.3f}")
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
