"""An agent's sessions on one small repository, replayed with and without the history
index (issue 55, part 6; a benchmark, not a test).

An agent's sessions repeat each other, and prompt lookup sees only the prompt it was
sent. This replays five recorded-style sessions on a small repository (``inventory/``)
through the real engine (``app.loading.load_engine``, as ``draftpen serve`` loads a
pair), each a new conversation, in order:

- ``first``: write ``inventory/store.py`` (a ~450-token module), greedy;
- ``same again``: the same request in a new session (a test failed elsewhere), greedy:
  the reply is the first one token for token;
- ``retry T0.7``: the same request at temperature 0.7, another seed;
- ``rewrite after a failed test``: the first reply in the conversation and a failing
  test's message, the whole file asked again, greedy (prompt lookup sees the first reply);
- ``same scaffold, new project``: a sibling module (``library/catalog.py``), greedy.

Each arm gets an engine of its own, loaded fresh: ``prompt lookup`` (no history index)
and ``index`` (a history index in a new temporary directory, empty at the start). Per
session and arm it prints the share of the reply that came from accepted drafts,
tokens per target pass, decode seconds and tokens/s, the loop's host milliseconds per
token, and whether a greedy reply equals the other arm's (``--exact`` promises it).

    DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models PYTHONPATH=. \\
        python benchmarks/history_replay.py --pair starter --exact --json OUT.json

About five minutes on a 2-core CPU with the starter pair (``--max-tokens 450``).
``--drafter ngram --draft-tokens 8`` measures the n-gram drafter alone at a fixed K;
the default is ``auto``, what a user gets.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from app.loading import load_engine
from backends.base import ChatMessage
from backends.caches.draft_history import DraftHistory, HistorySettings
from backends.engine import Engine, GenerationRequest
from backends.sampling.filters import SamplingParams

SYSTEM = (
    "You are a coding agent working in the repository `shop/`. It holds `inventory/` "
    "(items a shop keeps) and `library/` (books a library lends). Write complete, "
    "working Python 3.11 files with type hints and docstrings. When asked for a file, "
    "reply with the whole file in one ```python code block and nothing else."
)
STORE_TASK = (
    "Create `inventory/store.py`: a dataclass `Item` (name, price, quantity) and a class "
    "`Store` that keeps items in a dict by name, with methods add, remove, restock, "
    "sell (refuses to sell more than is in stock), total_value, low_stock(threshold) "
    "returning the names of items below it, and to_json / from_json."
)
FAILED_TEST = (
    "The test `test_low_stock_is_sorted` failed: `low_stock` must return the names "
    "sorted alphabetically. Write the whole file `inventory/store.py` again with that fixed."
)
CATALOG_TASK = (
    "Create `library/catalog.py`: a dataclass `Book` (title, author, copies) and a class "
    "`Catalog` that keeps books in a dict by title, with methods add, remove, restock, "
    "lend (refuses to lend more copies than it has), total_copies, scarce(threshold) "
    "returning the titles of books below it, and to_json / from_json."
)


@dataclass(frozen=True)
class Session:
    """One recorded session: its name, what it asks, and how it samples."""

    name: str
    turns: tuple[tuple[str, str], ...]  # (role, text); "{first}" is the first reply
    temperature: float = 0.0
    seed: int | None = None


SESSIONS = (
    Session("first", (("user", STORE_TASK),)),
    Session("same again", (("user", STORE_TASK),)),
    Session("retry T0.7", (("user", STORE_TASK),), temperature=0.7, seed=7),
    Session(
        "rewrite after a failed test",
        (("user", STORE_TASK), ("assistant", "{first}"), ("user", FAILED_TEST)),
    ),
    Session("same scaffold, new project", (("user", CATALOG_TASK),)),
)


@dataclass
class Figures:
    """One session's reply in one arm."""

    session: str
    arm: str
    tokens: int
    drafted_share: float
    tokens_per_target_pass: float
    decode_seconds: float
    tokens_per_second: float
    host_ms_per_token: float
    prompt_tokens: int
    text: str


def run_session(
    engine: Engine, session: Session, first_reply: str, args: argparse.Namespace
) -> tuple[Figures, str]:
    """One session through the engine; its figures and its reply's text."""
    messages = [ChatMessage("system", SYSTEM)]
    for role, text in session.turns:
        messages.append(ChatMessage(role, text.replace("{first}", first_reply)))
    prompt = engine.chat_prompt(messages)
    params = SamplingParams(temperature=session.temperature, seed=session.seed)
    request = GenerationRequest(
        tuple(prompt),
        params=params,
        max_tokens=args.max_tokens,
        drafter=args.drafter,
        draft_tokens=args.draft_tokens,
        exact=args.exact,
    )
    tokens, drafted, text = 0, 0, ""
    stats = None
    for event in engine.generate(request):
        tokens += len(event.tokens)
        drafted += sum(event.from_draft)
        text += event.text
        stats = event.stats
    assert stats is not None
    return (
        Figures(
            session=session.name,
            arm="",
            tokens=tokens,
            drafted_share=round(drafted / max(1, tokens), 3),
            tokens_per_target_pass=round(stats.tokens_per_target_pass, 3),
            decode_seconds=round(stats.decode_seconds, 2),
            tokens_per_second=round(stats.decode_tokens_per_second, 2),
            host_ms_per_token=round(stats.host_ms_per_token, 3),
            prompt_tokens=len(prompt),
            text=text,
        ),
        text,
    )


def run_arm(arm: str, args: argparse.Namespace, history_dir: Path | None) -> list[Figures]:
    """Every session, in order, through one freshly loaded engine."""
    history = HistorySettings(history_dir, args.history_bytes) if history_dir else None
    engine = load_engine(args.pair, n_ctx=args.context, exact_output=args.exact, history=history)
    figures: list[Figures] = []
    first_reply = ""
    try:
        for session in SESSIONS:
            if args.only and session.name not in args.only:
                continue
            result, text = run_session(engine, session, first_reply, args)
            result.arm = arm
            first_reply = first_reply or text
            figures.append(result)
            print(
                f"{arm:<14} {session.name:<28} {result.tokens:>5} tokens  "
                f"drafted {result.drafted_share:6.1%}  {result.tokens_per_target_pass:5.2f} "
                f"tok/pass  {result.decode_seconds:7.1f} s  {result.tokens_per_second:6.2f} tok/s  "
                f"host {result.host_ms_per_token:6.3f} ms/tok",
                flush=True,
            )
            remembered: DraftHistory | None = engine.history
            if remembered is not None:
                remembered.flush(60)  # what a next session finds (indexed off its path)
    finally:
        engine.close()
    return figures


def main() -> None:
    """Replay both arms and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=450)
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--exact", action="store_true", help="exact kernels (--exact)")
    parser.add_argument("--history-bytes", type=int, default=48 << 20)
    parser.add_argument("--only", type=lambda text: text.split(","), default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    baseline = run_arm("prompt lookup", args, None)
    with tempfile.TemporaryDirectory() as directory:
        indexed = run_arm("index", args, Path(directory) / "history")
    print()
    for alone, with_index in zip(baseline, indexed, strict=True):
        greedy = next(s for s in SESSIONS if s.name == alone.session).temperature == 0
        same = "same text" if alone.text == with_index.text else "TEXT DIFFERS"
        print(
            f"{alone.session:<28} drafted {alone.drafted_share:6.1%} -> "
            f"{with_index.drafted_share:6.1%}, tok/pass {alone.tokens_per_target_pass:.2f} -> "
            f"{with_index.tokens_per_target_pass:.2f}, time {alone.decode_seconds:.1f} -> "
            f"{with_index.decode_seconds:.1f} s"
            + (f", {same}" if greedy else " (sampled: texts may differ)")
        )
    print(f"load average {os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s in all")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {"args": vars(args), "runs": [asdict(f) for f in baseline + indexed]},
                out,
                indent=2,
            )


if __name__ == "__main__":
    main()
