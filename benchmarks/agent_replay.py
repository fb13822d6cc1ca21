"""Replay a real agent's recorded sessions (``benchmarks/agent_recording.py``) through
the real engine, with the history index and with prompt lookup alone (issue 55, part
6; a benchmark, not a test).

Each arm gets a ``draftpen serve`` of its own in a fresh home, the same settings but
``--history-index``: ``prompt lookup`` (``0``: nothing remembered) and ``index`` (the
default budget, empty at the start). The recorded requests are sent in their order
with a real HTTP client, streamed as the agent read them (later requests hold the
recorded replies, as the agent sent them). Per session and arm it prints the share of
the replies that came from accepted drafts, tokens per target pass, decode time and
tokens/s, and the loop's host milliseconds per token, from the engine's own
statistics; and whether each reply was the other arm's text (greedy under ``--exact``
it must be).

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        python benchmarks/agent_replay.py sessions.jsonl --pair starter --exact \\
        --json OUT.json

``--temperature 0`` replays every request greedy (the agent's own temperature
otherwise).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from app.settings import MODELS_DIR_ENV, SETTINGS_FILENAME, Settings, models_dir, save_settings
from benchmarks.agent_edits import Reply, send
from benchmarks.agent_recording import recorded
from benchmarks.serve_process import start_serve, stop_serve, tree_commit

ARMS = {"prompt lookup": "0", "index": "auto"}
ANSWERED = ("/v1/responses", "/v1/messages", "/v1/chat/completions")


def replay_arm(args: argparse.Namespace, arm: str, requests: list[dict[str, Any]]) -> list[Reply]:
    """Every recorded request through a fresh engine with ``arm``'s history index."""
    home = Path(tempfile.mkdtemp(prefix="agent-replay-"))
    settings = Settings(exact_output=args.exact, drafter=args.drafter)  # type: ignore[arg-type]
    save_settings(settings, home / "config" / SETTINGS_FILENAME)
    process, url, key = start_serve(
        args.pair,
        args.context,
        home,
        name="agent-replay",
        arguments=("--history-index", ARMS[arm]),
        environment={MODELS_DIR_ENV: str(models_dir())},
    )
    replies = []
    headers = {"Authorization": f"Bearer {key}", "x-api-key": key}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=3600) as client:
            for request in requests:
                body = dict(request["body"])
                if args.temperature is not None:
                    body["temperature"] = args.temperature
                replies.append(send(client, request["path"], body))
                print(f"  {arm}: {request['session']}: {_line(replies[-1])}", flush=True)
    finally:
        stop_serve(process)
    return replies


def _line(reply: Reply) -> str:
    stats = reply.stats
    return (
        f"{stats.get('generated_tokens', 0)} tokens, {stats.get('accepted', 0)} from drafts, "
        f"{stats.get('tokens_per_target_pass', 0.0):.2f} a pass, {reply.seconds:.1f} s"
    )


def session_figures(
    requests: list[dict[str, Any]], replies: list[Reply]
) -> dict[str, dict[str, float]]:
    """Per session: tokens, accepted drafts, target passes, decode seconds, host cost."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for request, reply in zip(requests, replies, strict=True):
        stats, figures = reply.stats, sums[request["session"]]
        tokens = stats.get("generated_tokens", 0)
        figures["requests"] += 1
        figures["tokens"] += tokens
        figures["accepted"] += stats.get("accepted", 0)
        figures["drafted"] += stats.get("drafted", 0)
        passes = stats.get("tokens_per_target_pass", 0.0)
        figures["target_passes"] += tokens / passes if passes else 0
        rate = stats.get("decode_tokens_per_second", 0.0)
        figures["decode_seconds"] += tokens / rate if rate else 0.0
        figures["host_ms"] += stats.get("host_ms_per_token", 0.0) * tokens
        figures["client_seconds"] += reply.seconds
    return {name: dict(figures) for name, figures in sums.items()}


def report(name: str, figures: dict[str, float]) -> dict[str, float]:
    """One session's row: shares and rates from its sums."""
    tokens = figures["tokens"] or 1
    return {
        "requests": int(figures["requests"]),
        "tokens": int(figures["tokens"]),
        "drafted_share": round(figures["accepted"] / tokens, 4),
        "tokens_per_target_pass": round(tokens / (figures["target_passes"] or tokens), 3),
        "decode_seconds": round(figures["decode_seconds"], 2),
        "decode_tokens_per_second": round(tokens / (figures["decode_seconds"] or 1), 2),
        "host_ms_per_token": round(figures["host_ms"] / tokens, 3),
        "client_seconds": round(figures["client_seconds"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--exact", action="store_true", help="bit-exact greedy (--exact)")
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    requests = [line for line in recorded(args.recording) if line["path"] in ANSWERED]
    if not requests:
        raise SystemExit(f"{args.recording} holds no requests to replay")
    print(f"{len(requests)} requests, {args.pair}, {tree_commit()}, {platform.processor()}")
    results: dict[str, Any] = {"pair": args.pair, "commit": tree_commit(), "arms": {}}
    replies_by_arm = {}
    for arm in ARMS:
        replies_by_arm[arm] = replay_arm(args, arm, requests)
        sums = session_figures(requests, replies_by_arm[arm])
        results["arms"][arm] = {name: report(name, sums[name]) for name in sums}
    same = [
        mine.output == theirs.output for mine, theirs in zip(*replies_by_arm.values(), strict=True)
    ]
    results["same_text"] = same
    header = f"{'session':14} {'arm':14} {'req':>4} {'tokens':>6} {'drafted':>8} "
    print(header + f"{'tok/pass':>8} {'decode s':>9} {'tok/s':>7} {'host ms':>8}")
    for name in dict.fromkeys(line["session"] for line in requests):
        for arm in ARMS:
            row = results["arms"][arm][name]
            print(
                f"{name:14} {arm:14} {row['requests']:>4} {row['tokens']:>6} "
                f"{row['drafted_share']:>8.1%} {row['tokens_per_target_pass']:>8.2f} "
                f"{row['decode_seconds']:>9.1f} {row['decode_tokens_per_second']:>7.1f} "
                f"{row['host_ms_per_token']:>8.3f}"
            )
    print(f"replies the same text in both arms: {sum(same)} of {len(same)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
