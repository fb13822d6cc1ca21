"""What serving several clients costs one client alone (a benchmark, not a test; issue 37).

Starts two real ``draftpen serve --pair PAIR`` engines, one ``--parallel 1`` and one
``--parallel N``, both loaded at once, and asks them in turn (never both at the same
time) for the same ``--max-tokens`` reply over the OpenAI chat API, streamed, at
temperature 0. Reports each engine's decode tokens/s (after the first token) per
repeat and the ratio of the medians: the tax the parallel engine's machinery (the hop
to the runtime thread, the batcher, the per-sequence logits copy) puts on one user.
Both engines alternate, so drift in the machine's speed lands on both.

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        python benchmarks/parallel_tax.py --repeats 6 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.concurrent_requests import DECODE_PROMPT, Chats
from benchmarks.serve_process import start_serve, stop_serve, tree_commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--serve-arg", action="append", default=[], help="for both engines")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    settings = {"one": ["--parallel", "1"], "many": ["--parallel", str(args.parallel)]}
    engines: dict[str, tuple[Any, Chats]] = {}
    try:
        for name, arguments in settings.items():
            home = Path(tempfile.mkdtemp(prefix=f"parallel-tax-{name}-"))
            process, url, key = start_serve(
                args.pair,
                args.context,
                home,
                name=f"parallel-tax-{name}",
                arguments=[*arguments, *args.serve_arg],
            )
            engines[name] = (process, Chats(url, key, args.pair))
        messages = [{"role": "user", "content": DECODE_PROMPT}]
        for _, chats in engines.values():  # a warm-up each
            chats.send(messages, 16)
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for repeat in range(args.repeats):
            order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
            for name in order:
                run = engines[name][1].send(messages, args.max_tokens)
                decode = max(run.completion_tokens - 1, 0) / max(run.done - run.first_token, 1e-9)
                rates[name].append(round(decode, 2))
                print(
                    f"  {name}: {decode:.2f} tok/s ({run.completion_tokens} tokens)",
                    file=sys.stderr,
                )
    finally:
        for process, _ in engines.values():
            stop_serve(process)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    result = {
        "commit": tree_commit(),
        "pair": args.pair,
        "parallel": args.parallel,
        "serve_args": args.serve_arg,
        "tokens_per_second": rates,
        "medians": medians,
        "many_over_one": round(medians["many"] / medians["one"], 3),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
