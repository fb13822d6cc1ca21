"""The loop's host cost per token drafting with a head (MTP, EAGLE-3) against drafting
with a draft model, on a runtime that sleeps GPU-like times (issue 54 part 7; a
benchmark, not a test).

It reuses ``benchmarks/simulated_runtime.py``'s :class:`SimulatedModel` (logits over a
151,936-token vocabulary shaped like a real model's, forwards that take their nominal
time) for the target, a draft model, and a *head*: a simulated model read through the
``DraftHead`` protocol (``start`` reads what the target accepted and the pending token,
``step`` chains one token, ``finish`` forgets the chain), as llama.cpp's heads are read
by ``backends/speculation/mtp_drafter.py`` and its EAGLE-3 subclass. The head and the
draft model agree with the target equally often (``--acceptance``), so the two modes
differ only in what the loop does around them. Per temperature and mode it prints
tokens/s, the ideal tokens/s (the same tokens over the forwards' nominal cost), and
the host milliseconds per token (decode time less the time inside the runtimes).

    PYTHONPATH=. python benchmarks/head_host_cost.py --wait virtual --repeats 3
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from backends.sampling.filters import SamplingParams
from backends.sampling.rows import HostRows, LogitRows
from backends.speculation.draft_policy import DraftPolicy, FixedDraftPolicy
from backends.speculation.eagle3_drafter import Eagle3Drafter
from backends.speculation.model_drafter import ModelDrafter
from backends.token_prefix import common_prefix_length
from benchmarks.simulated_runtime import Costs, RunResult, SimulatedModel, VirtualClock, run_once


class SimulatedHead:
    """A draft head over a simulated model: it keeps the target's accepted tokens, reads
    the new ones in one forward and chains one token a step."""

    def __init__(self, model: SimulatedModel) -> None:
        self.model = model
        self._kept = 0

    def start(self, evaluated: int, context: Sequence[int]) -> LogitRows | None:
        """Catch up with ``context`` (the target's cache and the pending token)."""
        model = self.model
        keep = common_prefix_length(model.cached_tokens, context[:evaluated])
        model.rollback(keep)
        self._kept = evaluated
        rows = model.forward(list(context[keep:]), last_only=True)
        return HostRows(rows)

    def step(self, token: int) -> LogitRows:
        """Chain ``token``; the row after it."""
        return HostRows(self.model.forward([token]))

    def finish(self) -> None:
        """Forget the chain's drafted positions."""
        self.model.rollback(min(self._kept, len(self.model.cached_tokens)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target-ms", type=float, default=8.0, help="target forward, 1 token")
    parser.add_argument("--extra-ms", type=float, default=0.3, help="per extra verified token")
    parser.add_argument("--draft-ms", type=float, default=2.0, help="draft model, 1 token")
    parser.add_argument("--head-ms", type=float, default=0.8, help="head step, 1 token")
    parser.add_argument("--acceptance", type=float, default=0.8)
    parser.add_argument("--k", default="4,8")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--wait", choices=("sleep", "virtual"), default="virtual")
    args = parser.parse_args()
    clock = VirtualClock() if args.wait == "virtual" else None
    if clock is not None:
        clock.install()

    def simulated(name: str, first_ms: float, agreement: float | None) -> SimulatedModel:
        costs = Costs(first_ms / 1e3, 0.05e-3 if agreement is not None else args.extra_ms / 1e3)
        return SimulatedModel(name, costs, agreement=agreement, clock=clock)

    target = simulated("sim-target", args.target_ms, None)
    draft = simulated("sim-draft", args.draft_ms, args.acceptance)
    head_model = simulated("sim-head", args.head_ms, args.acceptance)
    head = Eagle3Drafter(target, SimulatedHead(head_model))
    prompt = target.tokenize("write a function that sums a list of numbers, and explain it")
    lengths = [int(k) for k in args.k.split(",") if k]
    print(
        f"target {args.target_ms} ms (+{args.extra_ms} a token), draft model {args.draft_ms} ms, "
        f"head {args.head_ms} ms, acceptance {args.acceptance}, {args.wait} waits"
    )
    print(f"{'temp':>4} {'mode':<12} {'tok/s':>7} {'ideal':>7} {'host ms/tok':>11} {'accept':>6}")
    for params in (
        SamplingParams(temperature=0.0, seed=1),
        SamplingParams(temperature=0.7, top_p=0.95, seed=1),
    ):
        modes: list[tuple[str, SimulatedModel, DraftPolicy]] = [
            ("plain", draft, FixedDraftPolicy(None, 0))
        ]
        for k in lengths:
            modes.append((f"draft K={k}", draft, FixedDraftPolicy(ModelDrafter(draft), k)))
            modes.append((f"head K={k}", head_model, FixedDraftPolicy(head, k)))
        for mode, drafter_model, policy in modes:
            runs: list[RunResult] = []
            for _ in range(max(1, args.repeats)):
                runs.append(
                    run_once(mode, target, drafter_model, policy, params, prompt, args.tokens)
                )
            best = min(runs, key=lambda run: run.host_ms_per_token)
            accept = f"{best.acceptance:6.2f}" if best.acceptance is not None else "     -"
            print(
                f"{params.temperature:>4} {mode:<12} {best.achieved_tps:7.1f} "
                f"{best.ideal_tps:7.1f} {best.host_ms_per_token:11.3f} {accept}",
                flush=True,
            )


if __name__ == "__main__":
    main()
