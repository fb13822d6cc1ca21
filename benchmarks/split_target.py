"""Speculation with the target split over two workers, with network latency added.

Issue 38, part 6: plain decoding against speculative decoding (the draft model, on this
machine) when the target's layers sit on two ``draftpen worker``s on this machine, at
several round-trip times, beside the same pair on this machine alone. Each setting is
one ``draftpen bench`` run (plain and draft alternating per prompt, in one process), so
every gain is a ratio taken in one run. Latency comes from ``latency_proxy`` (this
kernel has no netem); its measured round trip is reported beside the asked one.

    PYTHONPATH=. python benchmarks/split_target.py --pair starter --rtt-ms 0.5,2 \
        --json benchmarks/results/DATE-split-target.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.latency_proxy import LatencyProxy, echo_server, round_trip
from benchmarks.serve_process import REPO, tree_commit


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_worker(
    home: Path, threads: int, prefix: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], int]:
    """A ``draftpen worker`` on a free loopback port (``prefix``: e.g. taskset), waited for."""
    from backends.workers.endpoints import Endpoint
    from backends.workers.wire import unreachable

    port = free_port()
    command = [sys.executable, "-m", "app.main", "worker", "--port", str(port)]
    process = subprocess.Popen(
        [*prefix, *command, "--threads", str(threads)],
        cwd=REPO,
        env={**os.environ, "DRAFTPEN_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while unreachable(Endpoint("127.0.0.1", port)) is not None:
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit("a draftpen worker did not start")
        time.sleep(0.2)
    return process, port


def bench(args: argparse.Namespace, home: Path, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "app.main", "bench", "--pair", args.pair]
    command += ["--modes", args.modes, "--no-yardsticks", "--max-tokens", str(args.max_tokens)]
    command += ["--repeats", str(args.repeats), "--json"]
    for category in args.category:
        command += ["--category", category]
    result = subprocess.run(
        [*command, *extra],
        cwd=REPO,
        env={**os.environ, "DRAFTPEN_HOME": str(home)},
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.exit(f"draftpen bench failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout)


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Per mode over every category: tok/s, the ratio to plain, acceptance."""
    tokens: dict[str, int] = {}
    seconds: dict[str, float] = {}
    accepted: dict[str, int] = {}
    drafted: dict[str, int] = {}
    for by_mode in report["results"].values():
        for label, totals in by_mode.items():
            tokens[label] = tokens.get(label, 0) + totals["generated_tokens"]
            seconds[label] = seconds.get(label, 0.0) + totals["decode_seconds"]
            accepted[label] = accepted.get(label, 0) + totals["accepted"]
            drafted[label] = drafted.get(label, 0) + totals["drafted"]
    rate = {label: tokens[label] / seconds[label] for label in tokens}
    return {
        label: {
            "tok_s": round(rate[label], 2),
            "ratio_to_plain": round(rate[label] / rate["plain"], 3),
            "acceptance": round(accepted[label] / drafted[label], 3) if drafted[label] else None,
        }
        for label in rate
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--rtt-ms", default="0.5,2", help="round trips to add (0: loopback)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--modes", default="draft,auto", help="bench modes beside plain")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--category", action="append", default=[])
    parser.add_argument("--worker-threads", type=int, default=1)
    parser.add_argument("--worker-split", default=None, help="e.g. 0,1,1 (default: free memory)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    args.category = args.category or ["chat", "code"]
    home = Path(tempfile.mkdtemp(prefix="split-target-"))
    rows: list[dict[str, Any]] = []
    alone = bench(args, home, [])
    rows.append({"setting": "this machine alone", "rtt_ms": None, "modes": summary(alone)})
    print(rows[-1], file=sys.stderr)
    workers = [start_worker(home, args.worker_threads) for _ in range(2)]
    echo = echo_server()
    try:
        for rtt in [float(value) for value in args.rtt_ms.split(",")]:
            if rtt == 0:
                addresses = [f"127.0.0.1:{port}" for _, port in workers]
                measured = round_trip(echo)
            else:
                proxies = [LatencyProxy(("127.0.0.1", port), rtt / 2000) for _, port in workers]
                addresses = [proxy.address for proxy in proxies]
                measured = round_trip(("127.0.0.1", LatencyProxy(echo, rtt / 2000).port))
            extra = ["--workers", ",".join(addresses)]
            if args.worker_split:
                extra += ["--worker-split", args.worker_split]
            report = bench(args, home, extra)
            rows.append(
                {
                    "setting": f"split over 2 workers, {rtt:g} ms added",
                    "rtt_ms": rtt,
                    "measured_rtt_ms": round(measured * 1000, 3),
                    "placement": report["through"].get("target"),
                    "modes": summary(report),
                }
            )
            print(rows[-1], file=sys.stderr)
    finally:
        stop_workers(workers)
    result = {
        "pair": args.pair,
        "max_tokens": args.max_tokens,
        "categories": args.category,
        "worker_threads": args.worker_threads,
        "rows": rows,
    }
    write_result(result, args.json)


def stop_workers(workers: list[tuple[subprocess.Popen[bytes], int]]) -> None:
    """Stop the workers :func:`start_worker` started."""
    for process, _ in workers:
        process.terminate()
        process.wait()


def write_result(result: dict[str, Any], path: str | None) -> None:
    """Print the result as JSON, with the commit it ran at, and write it to ``path``."""
    text = json.dumps({"commit": tree_commit(), **result}, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


if __name__ == "__main__":
    main()
