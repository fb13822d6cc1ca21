"""Drafting the next round while the split target verifies ("speculative speculative
decoding"): does it pay? A prototype, measured before anything goes into the loop.

Issue 38, part 6. With the target's layers on workers, the main machine waits while
they verify a round, and its drafter is idle. The idea from the "Speculative speculative
decoding" article: during the verify, draft the next round for the likeliest outcome
(every draft accepted, and the bonus token the draft model itself would pick), and use
that draft when the guess holds. Exact by construction: the target still verifies every
token. This script runs three greedy decoders on the same split target and draft model,
in one process, alternating per prompt:

- ``plain``: one target forward per token;
- ``draft``: the draft model proposes K tokens, the target verifies them in one pass;
- ``draft+overlap``: as ``draft``, but the target's verify runs on a thread while this
  thread drafts the next round from ``context + drafts + guess``; when the verify
  accepts all K and its bonus token is the guess, that round's drafting is already done.

It reports tokens/s, how often the guess held, and checks that all three wrote the same
tokens. It is a prototype outside the product loop (``backends/speculation/loop.py``),
which keeps one runtime thread (two threads computing at once slow llama.cpp's OpenMP
build; see issue 34): measured here is whether overlapping could pay at all.

    PYTHONPATH=. python benchmarks/ssd_overlap.py --rtt-ms 0,2 --draft-tokens 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from backends.llamacpp.model import LlamaCppModel
from backends.speculation.drafters import common_prefix_length
from backends.workers.cluster import Workers
from benchmarks.latency_proxy import LatencyProxy
from benchmarks.split_target import start_worker, stop_workers, write_result

PROMPTS = [
    "<|im_start|>user\nWrite a Python function that merges two sorted lists.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nExplain what a hash map is in three sentences.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a JSON object describing a book with title, author, year and "
    "tags.<|im_end|>\n<|im_start|>assistant\n",
]


class Drafter:
    """The draft model's greedy guesses after a context, reusing its cache."""

    def __init__(self, model: LlamaCppModel) -> None:
        self.model = model

    def guesses(self, context: list[int], count: int) -> list[int]:
        model = self.model
        shared = min(common_prefix_length(list(model.cached_tokens), context), len(context) - 1)
        model.rollback(shared)
        row = model.forward(context[shared:], last_only=True)[-1]
        out: list[int] = []
        for _ in range(count):
            out.append(int(np.argmax(row)))
            if len(out) < count:
                row = model.forward([out[-1]], last_only=True)[-1]
        return out


def verify(target: LlamaCppModel, context: list[int], drafts: list[int]) -> tuple[int, int]:
    """Greedy verification: (accepted drafts, the token after them); target cache cut."""
    base = len(target.cached_tokens)
    rows = target.forward([context[-1], *drafts])
    accepted = 0
    while accepted < len(drafts) and int(np.argmax(rows[accepted])) == drafts[accepted]:
        accepted += 1
    target.rollback(base + 1 + accepted)
    return accepted, int(np.argmax(rows[accepted]))


def _verify_into(
    result: list[tuple[int, int]], target: LlamaCppModel, context: list[int], drafts: list[int]
) -> None:
    result.append(verify(target, context, drafts))


def generate(
    target: LlamaCppModel,
    drafter: Drafter,
    prompt: list[int],
    *,
    k: int,
    overlap: bool,
    max_tokens: int,
) -> dict[str, Any]:
    target.rollback(0)
    target.prefill(prompt[:-1])
    context = list(prompt)
    held = rounds = 0
    ready: list[int] | None = None  # next round's drafts (+ guess), made during a verify
    started = time.perf_counter()
    while len(context) - len(prompt) < max_tokens:
        if k == 0:
            accepted, token = verify(target, context, [])
            context.append(token)
        else:
            planned = ready if ready is not None else drafter.guesses(context, k + overlap)
            drafts, guess = planned[:k], (planned[k] if overlap else None)
            ready = None
            if overlap:
                result: list[tuple[int, int]] = []
                thread = threading.Thread(
                    target=_verify_into, args=(result, target, list(context), drafts)
                )
                thread.start()
                ahead = drafter.guesses([*context, *drafts, guess], k + 1)
                thread.join()
                accepted, token = result[0]
                if accepted == k and token == guess:
                    ready = ahead
                    held += 1
            else:
                accepted, token = verify(target, context, drafts)
            context.extend([*drafts[:accepted], token])
            rounds += 1
        if target.is_end_of_generation(context[-1]):
            break
    seconds = time.perf_counter() - started
    # A round may pass the limit or an end token by a few: compared up to both.
    tokens = context[len(prompt) :][:max_tokens]
    ends = [i for i, token in enumerate(tokens) if target.is_end_of_generation(token)]
    tokens = tokens[: ends[0] + 1] if ends else tokens
    return {"tokens": tokens, "seconds": seconds, "rounds": rounds, "held": held}


def run_setting(
    target: LlamaCppModel, drafter: Drafter, args: argparse.Namespace
) -> dict[str, Any]:
    modes = {"plain": (0, False), "draft": (args.draft_tokens, False)}
    modes["draft+overlap"] = (args.draft_tokens, True)
    totals = {name: {"tokens": 0, "seconds": 0.0, "rounds": 0, "held": 0} for name in modes}
    same = True
    for text in PROMPTS:
        prompt = target.tokenize(text, add_special=False)
        outputs = {}
        for name, (k, overlap) in modes.items():
            run = generate(
                target, drafter, prompt, k=k, overlap=overlap, max_tokens=args.max_tokens
            )
            outputs[name] = run["tokens"]
            for key in ("seconds", "rounds", "held"):
                totals[name][key] += run[key]
            totals[name]["tokens"] += len(run["tokens"])
        same = same and len({tuple(tokens) for tokens in outputs.values()}) == 1
    rates = {name: t["tokens"] / t["seconds"] for name, t in totals.items()}
    return {
        "tok_s": {name: round(rate, 2) for name, rate in rates.items()},
        "ratio_to_plain": {name: round(rate / rates["plain"], 3) for name, rate in rates.items()},
        "overlap_over_draft": round(rates["draft+overlap"] / rates["draft"], 3),
        "guess_held": f"{totals['draft+overlap']['held']} of {totals['draft+overlap']['rounds']}",
        "outputs_equal": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target GGUF")
    parser.add_argument("--draft", required=True, help="the draft GGUF")
    parser.add_argument("--rtt-ms", default="0,2")
    parser.add_argument("--draft-tokens", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--worker-split", default="0,1,1")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="workers on CPU 1, this process (draft, verify's local part) on CPU 0 with one "
        "thread: the main machine's CPU is then idle while the workers verify, as it is "
        "when they are other machines",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ssd-overlap-"))
    prefix = ("taskset", "-c", "1") if args.pin else ()
    workers = [start_worker(home, 1, prefix) for _ in range(2)]
    threads = None
    if args.pin:
        os.sched_setaffinity(0, {0})
        threads = 1
    draft = LlamaCppModel(args.draft, n_ctx=2048, n_threads=threads)
    drafter = Drafter(draft)
    rows = []
    try:
        for rtt in [float(value) for value in args.rtt_ms.split(",")]:
            proxies = [LatencyProxy(("127.0.0.1", port), rtt / 2000) for _, port in workers]
            addresses = ",".join(proxy.address for proxy in proxies)
            chosen = Workers.parse(addresses, args.worker_split)
            target = LlamaCppModel(
                args.target,
                n_ctx=2048,
                n_threads=threads,
                workers=chosen.ask(),
                worker_split=chosen.weights,
            )
            row = {
                "rtt_ms": rtt,
                "placement": target.placement,
                **run_setting(target, drafter, args),
            }
            rows.append(row)
            print(row, file=sys.stderr)
            target.close()
            for proxy in proxies:
                proxy.close()
    finally:
        stop_workers(workers)
    result = {
        "draft_tokens": args.draft_tokens,
        "pinned": args.pin,
        "worker_split": args.worker_split,
        "rows": rows,
    }
    write_result(result, args.json)


if __name__ == "__main__":
    main()
