"""draftpen's loop on a pair of GGUF files: speed, acceptance and host cost, per mode.

    python benchmarks/gpu_figures.py TARGET.gguf DRAFT.gguf [--tokens 128] [--repeats 3]

Runs the real engine (``backends.engine.Engine``: the one speculative loop and the
``auto`` controller, calibrated on this machine) at temperature 0 and at 0.7 with
top_p 0.95 (an OpenAI client's defaults), for plain decoding, the draft model at K=4,
n-gram drafts and ``auto``, each repeated and reported as the median run. Prints a
Markdown table: decode tok/s, the ratio to plain decoding in the same run, acceptance,
and the loop's host time per generated token (time outside the runtime's forward
calls), which is what this benchmark exists to show on fast hardware.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.sampling.filters import SamplingParams
from backends.select import load_model

PROMPT = (
    "Write a Python function that parses a CSV file of orders (id, customer, amount, date) "
    "and returns the total amount per customer, with type hints and a docstring."
)
MODES = (
    ("plain", "none", 0),
    ("draft K=4", "model", 4),
    ("n-gram K=8", "ngram", 8),
    ("auto", "auto", 0),
)
TEMPERATURES = ((0.0, 1.0), (0.7, 0.95))


def run_once(
    engine: Engine,
    prompt: tuple[int, ...],
    drafter: str,
    k: int,
    params: SamplingParams,
    tokens: int,
    *,
    exact: bool = False,
) -> dict[str, Any]:
    """One generation; its statistics as plain data, the decision and the token ids."""
    request = GenerationRequest(
        prompt_tokens=prompt,
        params=params,
        max_tokens=tokens,
        drafter=drafter,
        draft_tokens=k,
        exact=exact,
    )
    last = None
    decision = ""
    output: list[int] = []
    for event in engine.generate(request):
        last = event
        decision = event.decision or decision
        output.extend(event.tokens)
    assert last is not None
    return {**last.stats.as_dict(), "decision": decision, "tokens": output}


def main(argv: list[str] | None = None) -> int:
    """Load the pair, calibrate, run every mode at both temperatures, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    target = load_model(args.target, runtime="llamacpp", n_ctx=2048)
    draft = load_model(args.draft, runtime="llamacpp", n_ctx=2048)
    engine = Engine(target, draft)
    engine.calibrate()
    prompt = tuple(engine.chat_prompt([ChatMessage("user", PROMPT)]))
    print("| temperature | mode | tok/s | vs plain | acceptance | host ms/token |")
    print("|---|---|---|---|---|---|")
    for temperature, top_p in TEMPERATURES:
        params = SamplingParams(temperature=temperature, top_p=top_p, seed=1)
        for _label, drafter, k in MODES:
            run_once(engine, prompt, drafter, k, params, 16)  # warm up, untimed
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in MODES}
        for _ in range(args.repeats):  # modes alternate, so drift hits each alike
            for label, drafter, k in MODES:
                runs[label].append(run_once(engine, prompt, drafter, k, params, args.tokens))
        plain = statistics.median(r["decode_tokens_per_second"] for r in runs["plain"])
        for label, _, _ in MODES:
            speed = statistics.median(r["decode_tokens_per_second"] for r in runs[label])
            acceptance = statistics.median(r["acceptance_rate"] for r in runs[label])
            host = [r.get("host_ms_per_token") for r in runs[label]]
            host_text = (
                f"{statistics.median(h for h in host if h is not None):.3f}"
                if any(h is not None for h in host)
                else "n/a"
            )
            print(
                f"| {temperature} | {label} | {speed:.1f} | {speed / plain:.2f}x | "
                f"{acceptance:.2f} | {host_text} |",
                flush=True,
            )
        print(f"\nauto at temperature {temperature}: {runs['auto'][-1]['decision']}\n")
    costs = engine.costs
    if costs is not None:
        print(
            f"calibrated costs (ms): target {costs.target_seconds}, draft step "
            f"{costs.draft_step_seconds}"
        )
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
