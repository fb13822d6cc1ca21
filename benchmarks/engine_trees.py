"""The same reply from the engines of two source trees, and llama.cpp's own server (a
benchmark, not a test).

Starts ``draftpen serve --pair PAIR`` from this tree and from ``--against`` (another
checkout, e.g. ``git worktree add /tmp/before <commit>``), each with the same
``--serve-arg``s, and, with ``--peer-llama-server``, llama-server on the pair's target
(plain decoding, one slot). All stay loaded; the same streamed greedy reply is asked of
each in turn, never two at once, the order rotating each repeat so drift in the
machine's speed lands on all. Reports each engine's decode tokens/s (after the first
token) per repeat, the medians, and each engine's median over this tree's. This is how
a change to the engine's process layout (issue 52: the runtime in a child process) is
measured before and after in one run.

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        python benchmarks/engine_trees.py --pair starter --against /tmp/before \\
        --peer-llama-server /tmp/llama-server-build/bin/llama-server --json OUT.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.concurrent_requests import DECODE_PROMPT, Chats, free_port, llama_server
from benchmarks.serve_process import REPO, start_serve, stop_serve, tree_commit


def main() -> None:
    """Run the engines in turn and print (and keep) their decode rates."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--against", type=Path, required=True, help="the other tree")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--serve-arg", action="append", default=[], help="for both engines")
    parser.add_argument(
        "--drafter", default="none", help="what draftpen drafts with (none: plain decoding)"
    )
    parser.add_argument("--peer-llama-server", type=Path, default=None, metavar="BINARY")
    parser.add_argument("--peer-threads", type=int, default=None, help="default: physical")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    trees = {"this": REPO, "against": args.against.resolve()}
    commits = {name: tree_commit(repo) for name, repo in trees.items()}
    messages = [{"role": "user", "content": DECODE_PROMPT}]
    rates: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        engines: dict[str, Chats] = {}
        for name, repo in trees.items():
            home = Path(tempfile.mkdtemp(prefix=f"engine-trees-{name}-"))
            process, url, key = start_serve(
                args.pair, args.context, home, name=f"trees-{name}",
                arguments=args.serve_arg, repo=repo,
            )  # fmt: skip
            stack.callback(stop_serve, process)
            speculative = {"speculative": {"drafter": args.drafter}}
            engines[name] = Chats(url, key, args.pair, extra_body=speculative)
        if args.peer_llama_server is not None:
            url = stack.enter_context(llama_server(peer_command(args)))
            engines["llama-server"] = Chats(url, "none", args.pair)
        for chats in engines.values():  # a warm-up each
            chats.send(messages, 16)
        rates = {name: [] for name in engines}
        names = list(engines)
        for repeat in range(args.repeats):
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                run = engines[name].send(messages, args.max_tokens)
                decode = max(run.completion_tokens - 1, 0) / max(run.done - run.first_token, 1e-9)
                rates[name].append(round(decode, 2))
                tokens = run.completion_tokens
                print(f"  {name}: {decode:.2f} tok/s ({tokens} tokens)", file=sys.stderr)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    result: dict[str, Any] = {
        "commits": commits,
        "pair": args.pair,
        "serve_args": args.serve_arg,
        "drafter": args.drafter,
        "max_tokens": args.max_tokens,
        "tokens_per_second": rates,
        "medians": medians,
        "over_this": {name: round(medians[name] / medians["this"], 3) for name in medians},
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def peer_command(args: argparse.Namespace) -> list[str]:
    """llama-server on the pair's target alone: one slot, plain decoding."""
    from app.models.pair_files import pair_files
    from backends.llamacpp.library import physical_cores

    files = pair_files(args.pair, "llamacpp")
    threads = args.peer_threads or physical_cores()
    command = [str(args.peer_llama_server), "-m", str(files.target_path), "-np", "1"]
    command += ["-c", str(args.context), "-t", str(threads), "--jinja"]
    return [*command, "--host", "127.0.0.1", "--port", str(free_port())]


if __name__ == "__main__":
    main()
