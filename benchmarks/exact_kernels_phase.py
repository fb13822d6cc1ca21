"""The exact phase of benchmarks/device_measure.py (issue 33): llama.cpp's default kernels
against exact kernels, the pair loaded twice at once, alternating; prompt reading, greedy
decoding per drafter, and whether each drafter's output equals plain decoding's."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from backends.base import ChatMessage
from backends.engine import Engine
from backends.sampling.filters import SamplingParams
from backends.select import load_model
from benchmarks import gpu_figures
from benchmarks.phase_results import (
    WARM_UP_TOKENS,
    Results,
    median_of,
    past_deadline,
    rotated,
    text,
)
from benchmarks.source_prompt import source_tokens

KERNELS = ("default", "exact")
DECODE_MODES = (("plain", "none", 0), ("draft K=4", "model", 4), ("auto", "auto", 0))
GREEDY = SamplingParams(temperature=0.0, seed=1)


def read_prompt(engine: Engine, tokens: Sequence[int]) -> float:
    """Seconds to read ``tokens`` into the target's empty cache, up to the logits of the
    last one (which waits for the GPU to finish)."""
    target = engine.target
    target.rollback(0)
    started = time.perf_counter()
    target.prefill(tokens[:-1])
    target.forward(tokens[-1:], last_only=True)
    seconds = time.perf_counter() - started
    target.rollback(0)
    return seconds


def exact_phase(args: argparse.Namespace, results: Results) -> None:
    n_ctx = max(args.prompts) + args.tokens + 512
    engines: dict[str, Engine] = {}
    try:
        for kernels in KERNELS:
            started = time.perf_counter()
            target = load_model(
                args.target, runtime="llamacpp", n_ctx=n_ctx, exact_kernels=kernels == "exact"
            )
            draft = load_model(args.draft, runtime="llamacpp", n_ctx=n_ctx)
            engines[kernels] = engine = Engine(target, draft)
            loaded = time.perf_counter()
            costs = engine.calibrate()
            results.data["meta"][kernels] = {
                "load_seconds": round(loaded - started, 2),
                "calibrate_seconds": round(time.perf_counter() - loaded, 2),
                "exact_batch_limit": costs.exact_batch_limit,
                "target_ms": {n: round(s * 1e3, 3) for n, s in costs.target_seconds.items()},
                "draft_step_ms": (
                    round(costs.draft_step_seconds * 1e3, 3) if costs.draft_step_seconds else None
                ),
            }
            print(f"{kernels}: {json.dumps(results.data['meta'][kernels])}", flush=True)
        results.data["meta"]["n_ctx"] = n_ctx
        results.save()
        source = source_tokens(engines["default"], max(args.prompts))
        prompt = tuple(engines["default"].chat_prompt([ChatMessage("user", gpu_figures.PROMPT)]))
        for kernels, engine in engines.items():  # untimed: kernels load, caches warm
            read_prompt(engine, source[:512])
            for _label, drafter, k in DECODE_MODES:
                gpu_figures.run_once(
                    engine, prompt, drafter, k, GREEDY, WARM_UP_TOKENS, exact=kernels == "exact"
                )
        for repeat in range(args.repeats):
            if repeat and past_deadline():
                print("deadline: no more repeats", flush=True)
                break
            for label, drafter, k in rotated(DECODE_MODES, repeat):
                for kernels in rotated(KERNELS, repeat):
                    exact = kernels == "exact"
                    stats = gpu_figures.run_once(
                        engines[kernels], prompt, drafter, k, GREEDY, args.tokens, exact=exact
                    )
                    results.run(
                        kind="decode",
                        kernels=kernels,
                        mode=label,
                        repeat=repeat,
                        tok_s=stats["decode_tokens_per_second"],
                        generated=stats["generated_tokens"],
                        acceptance=stats["acceptance_rate"],
                        host_ms_per_token=stats["host_ms_per_token"],
                        decision=stats["decision"],
                        tokens=stats["tokens"],
                    )
            for size in args.prompts:
                for kernels in rotated(KERNELS, repeat):
                    seconds = read_prompt(engines[kernels], source[:size])
                    results.run(
                        kind="prompt",
                        kernels=kernels,
                        size=size,
                        repeat=repeat,
                        ms=round(seconds * 1e3, 2),
                        tok_s=round(size / seconds, 1),
                    )
    finally:
        for engine in engines.values():
            engine.close()


def summarize_exact(args: argparse.Namespace, results: Results) -> None:
    select = results.select

    def medians(key: str, **match: Any) -> list[float | None]:
        return [median_of(select(kernels=k, **match), key) for k in KERNELS]

    rows = [
        (f"read a {size}-token prompt (ms)", *medians("ms", kind="prompt", size=size))
        for size in args.prompts
    ] + [
        (f"decode {label} (tok/s)", *medians("tok_s", kind="decode", mode=label))
        for label, _, _ in DECODE_MODES
    ]
    summary: dict[str, Any] = {"medians": {}, "identical_to_plain": {}}
    lines = [
        f"### Exact kernels (issue 33): {args.target.name} + {args.draft.name}",
        "",
        f"Median of {args.repeats}, {args.tokens} tokens greedy; default and exact engines "
        "loaded together, alternating.",
        "",
        "| measure | default | exact | exact/default |",
        "|---|---:|---:|---:|",
    ]
    for name, default, exact in rows:
        ratio = exact / default if default and exact else None
        summary["medians"][name] = {"default": default, "exact": exact, "exact/default": ratio}
        lines.append(f"| {name} | {text(default)} | {text(exact)} | {text(ratio, 3)} |")
    lines.append("")
    for kernels in KERNELS:
        limit = results.data["meta"].get(kernels, {}).get("exact_batch_limit")
        acceptance = ", ".join(
            f"{label} {text(median_of(select(kernels=kernels, mode=label), 'acceptance'), 2)}"
            for label, _, _ in DECODE_MODES[1:]
        )
        lines.append(f"- {kernels}: exact_batch_limit {limit}, acceptance {acceptance}")
    lines += ["", "Greedy output equal to plain decoding's, token for token (same repeat):"]
    for kernels in KERNELS:
        plain = {
            r["repeat"]: r["tokens"]
            for r in results.select(kind="decode", kernels=kernels, mode="plain")
        }
        steady = all(tokens == next(iter(plain.values())) for tokens in plain.values())
        parts = [f"plain runs all alike: {'yes' if steady else 'NO'}"]
        for label, _, _ in DECODE_MODES[1:]:
            runs = [
                r
                for r in results.select(kind="decode", kernels=kernels, mode=label)
                if r["repeat"] in plain
            ]
            firsts = [
                first_difference(run["tokens"], plain[run["repeat"]])
                for run in runs
                if run["tokens"] != plain[run["repeat"]]
            ]
            same = len(runs) - len(firsts)
            summary["identical_to_plain"][f"{kernels}/{label}"] = {
                "identical": same,
                "runs": len(runs),
                "first_difference_at": firsts,
            }
            detail = f" (first difference at token {firsts})" if firsts else ""
            parts.append(f"{label} {same}/{len(runs)}{detail}")
        lines.append(f"- {kernels}: " + "; ".join(parts))
    default_plain, exact_plain = (
        [r["tokens"] for r in results.select(kind="decode", kernels=k, mode="plain")]
        for k in KERNELS
    )
    if default_plain and exact_plain:
        alike = default_plain[0] == exact_plain[0]
        summary["plain_default_equals_plain_exact"] = alike
        lines.append(
            f"- plain decoding, default vs exact kernels: {'same' if alike else 'DIFFERENT'}"
            + ("" if alike else f" from token {first_difference(default_plain[0], exact_plain[0])}")
        )
    results.data["summary"] = summary
    results.data["markdown"] = "\n".join(lines) + "\n"
    results.save()


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int:
    """The first position where two outputs differ (the shorter length if one is a prefix)."""
    pairs = zip(tokens, reference, strict=False)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(tokens), len(reference)))
