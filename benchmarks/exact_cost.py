"""What ``--exact`` (exact_output) costs: the starter pair loaded with llama.cpp's fastest
kernels (the default) and with exact kernels, measured side by side in one process.

Both engines stay loaded; every measurement alternates default, exact, default, exact,
so a busy machine's drift falls on both alike. Measured: reading a prompt of ~1k and
~8k tokens (the target's prefill, no logits), and greedy decoding of a short chat
prompt with ``auto`` (exact: auto verifies only in batches calibration found exact),
with the draft model at a fixed K = 4, and with ``none`` (plain decoding). Prints one
line per measurement, then the medians and the exact/default ratios; ``--json PATH``
writes them too. auto follows the costs calibration measured at load: on a busy
machine they are skewed, and so is auto (the fixed drafters are not).

    DRAFTPEN_MODELS_DIR=... .venv/bin/python benchmarks/exact_cost.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.loading import load_engine  # noqa: E402
from backends.base import ChatMessage  # noqa: E402
from backends.engine import Engine, GenerationRequest  # noqa: E402
from benchmarks.source_prompt import source_tokens  # noqa: E402

DECODE_PROMPT = "Write a Python function that parses an ISO 8601 date without libraries."
KERNELS = ("default", "exact")


def prompt_seconds(engine: Engine, tokens: list[int]) -> float:
    """Seconds to read ``tokens`` into an empty target cache."""
    engine.target.rollback(0)
    started = time.perf_counter()
    engine.target.prefill(tokens)
    seconds = time.perf_counter() - started
    engine.target.rollback(0)
    return seconds


def decode_rate(engine: Engine, drafter: str, exact: bool, max_tokens: int) -> tuple[float, int]:
    """Tokens per second after the first round (the prompt read apart), greedy, and how
    many tokens were timed."""
    prompt = engine.chat_prompt([ChatMessage("user", DECODE_PROMPT)])
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        max_tokens=max_tokens,
        drafter=drafter,
        draft_tokens=4,
        exact=exact,
    )
    first_at, first_count, count = 0.0, 0, 0
    for event in engine.generate(request):
        count += len(event.tokens)
        if not first_count:
            first_at, first_count = time.perf_counter(), count
    timed = count - first_count
    return timed / (time.perf_counter() - first_at), timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--short", type=int, default=1024, help="tokens of the short prompt")
    parser.add_argument("--long", type=int, default=8192, help="tokens of the long prompt")
    parser.add_argument("--long-repeats", type=int, default=1)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument(
        "--drafters",
        default="auto,model,none",
        help="decode with these (model: the draft model at a fixed K = 4, a verify batch of 5, "
        "exact under exact kernels; auto depends on the costs calibration measured, which a "
        "busy machine skews)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    n_ctx = args.long + 512
    engines = {
        kernels: load_engine(args.pair, n_ctx=n_ctx, exact_output=kernels == "exact")
        for kernels in KERNELS
    }
    for kernels, engine in engines.items():
        costs = engine.costs
        print(f"{kernels}: exact_batch_limit {costs.exact_batch_limit if costs else None}")
    results: dict[str, dict[str, list[float]]] = {kernels: {} for kernels in KERNELS}

    def record(kernels: str, name: str, value: float, note: str = "") -> None:
        results[kernels].setdefault(name, []).append(value)
        print(f"{kernels:8} {name:22} {value:9.3f} {note}", flush=True)

    short = source_tokens(engines["default"], args.short)
    for _ in range(args.repeats):
        for kernels in KERNELS:
            engine = engines[kernels]
            seconds = prompt_seconds(engine, short)
            record(
                kernels, f"prompt {args.short} tok/s", len(short) / seconds, f"({seconds:.1f} s)"
            )
        for drafter in args.drafters.split(","):
            for kernels in KERNELS:
                rate, count = decode_rate(
                    engines[kernels], drafter, kernels == "exact", args.decode_tokens
                )
                record(kernels, f"decode {drafter} tok/s", rate, f"({count} tokens)")
    long = source_tokens(engines["default"], args.long)
    for _ in range(args.long_repeats):
        for kernels in KERNELS:
            seconds = prompt_seconds(engines[kernels], long)
            record(kernels, f"prompt {args.long} tok/s", len(long) / seconds, f"({seconds:.1f} s)")

    summary = {
        name: {
            "default": statistics.median(results["default"][name]),
            "exact": statistics.median(results["exact"][name]),
            "exact/default": statistics.median(results["exact"][name])
            / statistics.median(results["default"][name]),
        }
        for name in results["default"]
    }
    print("\nmedians (tokens per second; exact/default < 1 means exact is slower):")
    for name, row in summary.items():
        print(
            f"  {name:22} default {row['default']:8.2f}  exact {row['exact']:8.2f}  "
            f"exact/default {row['exact/default']:.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "medians": summary}, indent=2))
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
