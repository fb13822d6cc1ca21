"""Several continuations in one batch against the single best one (issue 55 part 4; a
benchmark, not a test).

An agent sent the same request before, once greedy and once more: at temperature 0.7 (a
retry, ``--earlier retry``) or as an earlier version of the file, one token changed every
37 (``--earlier edited``). The history index holds both replies, the other one later
(so, at equal counts, its continuation is drafted first, and is wrong where they
part). The same request is then answered greedy, three ways, one target loaded once,
the order rotating per repeat:

- ``chain``: the n-gram drafter at K drafts, verifying its best continuation only;
- ``tree``: the same, with up to ``--tree-nodes`` more nodes a round for the index's
  other continuations, verified in the same batch (``backends/speculation/draft_tree.py``);
- ``plain``: no drafts (the yardstick, and what both must equal token for token).

Printed per arm: tokens per target pass, decode seconds, seconds per target pass (the
verify's cost grows with its batch), tokens/s, tree rounds and rounds won by another
branch. Plus the target's forward time by batch size (what ``auto`` decides with).

    DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models PYTHONPATH=. \\
        python benchmarks/tree_verify.py --model starter --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from backends.base import ChatMessage, Model
from backends.generation_events import SpeculativeStats
from backends.sampling.filters import SamplingParams
from backends.speculation.draft_policy import DraftPolicy, FixedDraftPolicy
from backends.speculation.history_index import HistoryIndex
from backends.speculation.loop import speculative_generate
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.reply_spec import ReplySpec
from tests.support.model_files import SMOLLM2_KEY, TARGET_KEY, require_model

REQUEST = (
    "Write `inventory/store.py`: a small in-memory inventory with an Item dataclass "
    "(sku, name, quantity, price) and a Store class with add, remove, restock and "
    "total_value methods, type hints and docstrings."
)
# Not a multiple of K + 1: else every edit would fall on a bonus token, never a draft.
EDIT_EVERY = 37
MODELS = {"starter": TARGET_KEY, "smollm2": SMOLLM2_KEY}


def reply(
    target: Model, prompt: list[int], policy: DraftPolicy, params: SamplingParams, limit: int
) -> tuple[list[int], SpeculativeStats]:
    """The reply's tokens and the run's statistics."""
    events = list(speculative_generate(target, prompt, policy, ReplySpec(params, limit)))
    return [token for event in events for token in event.tokens], events[-1].stats


def forward_costs(target: Model, prompt: list[int], sizes: list[int], repeats: int) -> dict:
    """Median seconds of a target forward of each batch size after ``prompt``."""
    target.rollback(0)
    target.prefill(prompt)
    costs = {}
    for size in sizes:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            target.forward(prompt[-size:])
            times.append(time.perf_counter() - started)
            target.rollback(len(prompt))
        costs[size] = sorted(times)[len(times) // 2]
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="starter")
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--tree-nodes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--exact", action="store_true", help="exact kernels (as --exact)")
    parser.add_argument(
        "--earlier",
        choices=("retry", "edited"),
        default="retry",
        help="the later reply in the index: a T0.7 retry, or the reply with edits",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from backends.llamacpp.model import LlamaCppModel

    target = LlamaCppModel(require_model(MODELS[args.model]), n_ctx=2048, exact_kernels=args.exact)
    prompt = target.tokenize(target.apply_chat_template([ChatMessage("user", REQUEST)]))
    greedy = SamplingParams()
    first, _ = reply(target, prompt, FixedDraftPolicy(None, 0), greedy, args.max_tokens)
    if args.earlier == "retry":
        retry_params = SamplingParams(temperature=0.7, seed=7)
        retry, _ = reply(target, prompt, FixedDraftPolicy(None, 0), retry_params, args.max_tokens)
    else:
        # An earlier version of the same file: one token changed every EDIT_EVERY.
        retry = [
            first[i + 1] if i % EDIT_EVERY == EDIT_EVERY - 1 and i + 1 < len(first) else token
            for i, token in enumerate(first)
        ]
    index = HistoryIndex(1 << 16)
    index.add([*prompt, *first])
    index.add([*prompt, *retry])
    k, exact_limit = args.draft_tokens, 7 if args.exact else None
    arms = {
        "plain": lambda: FixedDraftPolicy(None, 0),
        "chain": lambda: FixedDraftPolicy(NgramDrafter(history=index), k, exact_limit),
        "tree": lambda: FixedDraftPolicy(
            NgramDrafter(history=index), k, exact_limit, tree_nodes=args.tree_nodes
        ),
    }
    results: dict[str, list[dict]] = {name: [] for name in arms}
    names = list(arms)
    for repeat in range(args.repeats):
        for name in names[repeat % 3 :] + names[: repeat % 3]:
            target.rollback(0)  # each run reads the prompt again
            tokens, stats = reply(target, prompt, arms[name](), greedy, args.max_tokens)
            results[name].append(
                {
                    "equals_first": tokens == first,
                    "tokens": stats.generated_tokens,
                    "tokens_per_pass": round(stats.tokens_per_target_pass, 3),
                    "decode_seconds": round(stats.decode_seconds, 3),
                    "seconds_per_pass": round(stats.decode_seconds / stats.target_passes, 4),
                    "tokens_per_second": round(stats.decode_tokens_per_second, 2),
                    "tree_rounds": stats.tree_rounds,
                    "other_branch_rounds": stats.other_branch_rounds,
                }
            )
            print(name, results[name][-1], flush=True)
    sizes = [1, 1 + k, 1 + k + args.tree_nodes]
    costs = forward_costs(target, prompt, sizes, 5)
    print("forward seconds by batch size:", {size: round(s, 4) for size, s in costs.items()})
    summary = {
        "model": args.model,
        "earlier": args.earlier,
        "exact": args.exact,
        "retry_shares_tokens": sum(a == b for a, b in zip(first, retry, strict=False)),
        "arms": results,
        "forward_seconds": costs,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2))
    target.close()


if __name__ == "__main__":
    main()
