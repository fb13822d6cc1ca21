"""The tax phase of benchmarks/device_measure.py (issue 34): plain greedy decoding in this
process, through a real ``draftpen serve`` on a private Unix socket, and with
llama-cpp-python's ``Llama``, alternating, the order rotating run by run."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.client import EngineClient
from backends.base import ChatMessage
from backends.engine import Engine
from backends.select import load_model
from benchmarks import engine_client
from benchmarks.phase_results import (
    WARM_UP_TOKENS,
    Results,
    median_of,
    past_deadline,
    rotated,
    text,
)

REPO = Path(__file__).resolve().parent.parent


def start_engine(target: Path, n_ctx: int, socket_path: Path, log: Path) -> subprocess.Popen:
    """``draftpen serve`` for ``target`` on ``socket_path``, with this process's knobs."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [environment.get("PYTHONPATH")])]
    )
    serve = ["serve", "--socket", str(socket_path), "--context", str(n_ctx)]
    serve += ["--target", str(target), "--keep-alive", "-1"]
    command = [sys.executable, "-m", "benchmarks.device_measure", "serve-engine", *serve]
    with log.open("wb") as output:
        return subprocess.Popen(
            command,
            cwd=REPO,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def wait_for_engine(process: subprocess.Popen, socket_path: Path, log: Path) -> EngineClient:
    """The engine's client once it listens with its pair loaded."""
    client = EngineClient(socket_path, engine_pid=process.pid)
    deadline = time.time() + 600
    while time.time() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"draftpen serve exited ({process.returncode}):\n{tail}")
        if socket_path.exists():
            with contextlib.suppress(Exception):
                health = client.health()
                if health.loaded:
                    return client
        time.sleep(0.25)
    raise RuntimeError("draftpen serve did not load its pair in time")


def tax_phase(args: argparse.Namespace, results: Results) -> None:
    from backends.llamacpp.reference import LlamaCppReference

    n_ctx = args.context
    workdir = Path(tempfile.mkdtemp(prefix="dp-measure-"))
    socket_path, log = workdir / "engine.sock", workdir / "engine.log"
    started = time.perf_counter()
    process = start_engine(args.target, n_ctx, socket_path, log)  # loads while we do
    engine: Engine | None = None
    reference: LlamaCppReference | None = None
    try:
        engine = Engine(load_model(args.target, runtime="llamacpp", n_ctx=n_ctx))
        reference = LlamaCppReference(args.target, n_ctx=n_ctx)
        client = wait_for_engine(process, socket_path, log)
        health = client.health()
        loaded = health.loaded[0]
        results.data["meta"].update(
            {
                "n_ctx": n_ctx,
                "ready_seconds": round(time.perf_counter() - started, 2),
                "in_process_threads": getattr(engine.target, "n_threads", None),
                "in_process_gpu_offload": getattr(engine.target, "gpu_offload", None),
                "engine_pair": loaded.pair,
                "engine_conversation_cache": (
                    loaded.conversation_cache.model_dump() if loaded.conversation_cache else None
                ),
                "engine_exact": loaded.exact,
            }
        )
        results.save()
        prompt = tuple(engine.chat_prompt([ChatMessage("user", engine_client.PROMPT)]))

        def reference_rate(tokens: int) -> tuple[float, float]:
            assert reference is not None
            count, seconds = reference.decode_speed(prompt, tokens)
            return (count / seconds if seconds else 0.0), 0.0

        assert engine is not None
        runners: dict[str, Callable[[int], tuple[float, float]]] = {
            "in-process": lambda tokens: engine_client.in_process(engine, tokens),
            "through the engine": lambda tokens: engine_client.through_engine(
                client, loaded.pair, tokens
            ),
            "llama-cpp-python Llama": reference_rate,
        }
        for run in runners.values():  # untimed
            run(WARM_UP_TOKENS)
        for repeat in range(args.repeats):
            if repeat and past_deadline():
                print("deadline: no more repeats", flush=True)
                break
            for name in rotated(list(runners), repeat):
                rate, received = runners[name](args.tokens)
                results.run(
                    kind="decode",
                    way=name,
                    repeat=repeat,
                    tok_s=round(rate, 2),
                    received_tok_s=round(received, 2) if received else None,
                )
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        if process.poll() is None:
            process.kill()
        results.data["meta"]["engine_log_tail"] = log.read_text(errors="replace")[-1500:]
        if reference is not None:
            reference.close()
        if engine is not None:
            engine.close()


def summarize_tax(args: argparse.Namespace, results: Results) -> None:
    meta = results.data["meta"]
    where = (
        "GPU, all layers"
        if meta.get("in_process_gpu_offload") and meta.get("gpu_layers") != 0
        else f"CPU alone, {meta.get('in_process_threads')} threads"
    )
    lines = [
        f"### The engine's decode tax (issue 34): {args.target.name}, {where}",
        "",
        f"Plain greedy decoding, {args.tokens} tokens, median of {args.repeats}, alternating.",
        "",
        "| way | tok/s | vs in-process | runs |",
        "|---|---:|---:|---|",
    ]
    base = median_of(results.select(kind="decode", way="in-process"), "tok_s")
    summary: dict[str, Any] = {}
    for way in ("in-process", "through the engine", "llama-cpp-python Llama"):
        runs = results.select(kind="decode", way=way)
        rate = median_of(runs, "tok_s")
        ratio = rate / base if rate and base else None
        summary[way] = {"tok_s": rate, "vs_in_process": ratio}
        figures = ", ".join(f"{r['tok_s']:.1f}" for r in runs)
        lines.append(f"| {way} | {text(rate)} | {text(ratio, 3)} | {figures} |")
    # Run by run: each engine run over the in-process run of the same repeat.
    paired = []
    for run in results.select(kind="decode", way="through the engine"):
        mine = results.select(kind="decode", way="in-process", repeat=run["repeat"])
        if mine and mine[0]["tok_s"]:
            paired.append(run["tok_s"] / mine[0]["tok_s"])
    if paired:
        summary["engine_over_in_process_paired"] = paired
        lines += [
            "",
            "Engine over in-process, run by run: " + ", ".join(f"{p:.3f}" for p in paired),
        ]
    results.data["summary"] = summary
    results.data["markdown"] = "\n".join(lines) + "\n"
    results.save()
