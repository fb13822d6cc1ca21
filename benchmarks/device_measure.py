"""One device call's measurements on a pair of GGUF files (benchmarks/device_measure.sh).

Phases, each its own process, so that a crash or a timeout in one leaves the others':

- ``exact TARGET DRAFT`` (issue 33): the pair loaded twice at once, with llama.cpp's
  default kernels and with exact kernels (``exact_kernels``, what ``exact_output``
  loads); alternating between the two, reading a prompt of each ``--prompts`` size
  (an empty cache, the target alone, up to its first logits) and decoding greedily
  with the drafters ``none``, ``model`` (K=4) and ``auto`` (with ``exact`` requests on
  the exact engine). Also whether each drafter's greedy output equals plain
  decoding's token for token, per kernel choice.
- ``tax TARGET`` (issue 34): plain greedy decoding of the same prompt, in this process
  (``Engine.generate``, as benchmarks/gpu_figures.py runs it), through a real
  ``draftpen serve`` on a private Unix socket (the reply's own statistics), and with
  llama-cpp-python's high-level ``Llama`` (bench's "reference" yardstick); the three
  alternate, the order rotating run by run.

Every figure is printed as it is measured, and ``--json`` is rewritten after each
one, so a call stopped at its limit still returns what was measured.

Environment, also read by the engine process this starts:
    DP_MEASURE_THREADS      threads of every llama.cpp context (default: physical cores)
    DP_MEASURE_GPU_LAYERS   layers offloaded (default: all where the build offloads)
    DP_MEASURE_DEADLINE     Unix time after which no new repeat starts (the first always
                            runs); what was measured is summed up and written

    python -m benchmarks.device_measure exact TARGET DRAFT --json E.json --markdown E.md
    python -m benchmarks.device_measure tax TARGET --json T.json --markdown T.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# First, before anything imports numpy: on the lent GPU machine's image, importing numpy
# (or torch) before llama_cpp made CUDA model loading segfault (benchmarks/gpu_run.sh).
import llama_cpp

from app.client import EngineClient
from backends.base import ChatMessage
from backends.engine import Engine
from backends.sampling import SamplingParams
from backends.select import load_model
from benchmarks import engine_client, gpu_figures

REPO = Path(__file__).resolve().parent.parent
KERNELS = ("default", "exact")
DECODE_MODES = (("plain", "none", 0), ("draft K=4", "model", 4), ("auto", "auto", 0))
GREEDY = SamplingParams(temperature=0.0, seed=1)
WARM_UP_TOKENS = 8


def apply_knobs() -> dict[str, Any]:
    """Make DP_MEASURE_THREADS / DP_MEASURE_GPU_LAYERS the defaults of every model loaded
    here: draftpen's own (backends.llamacpp) and llama-cpp-python's ``Llama`` (bench's
    reference). Returns what was set."""
    import backends.llamacpp as ours
    import backends.llamacpp_reference as reference

    knobs: dict[str, Any] = {}
    threads = os.environ.get("DP_MEASURE_THREADS", "").strip()
    if threads:
        knobs["threads"] = int(threads)
        ours.physical_cores = reference.physical_cores = lambda: int(threads)
    layers = os.environ.get("DP_MEASURE_GPU_LAYERS", "").strip()
    if layers:
        knobs["gpu_layers"] = int(layers)
        original = ours.LlamaCppModel.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("gpu_layers", int(layers))
            original(self, *args, **kwargs)

        ours.LlamaCppModel.__init__ = init  # type: ignore[method-assign]
        if int(layers) == 0:
            reference.supports_gpu_offload = lambda: False
    knobs["gpu_offload_in_build"] = bool(llama_cpp.llama_supports_gpu_offload())
    knobs["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return knobs


def past_deadline() -> bool:
    deadline = os.environ.get("DP_MEASURE_DEADLINE", "").strip()
    return bool(deadline) and time.time() > float(deadline)


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


class Results:
    """A phase's figures: printed as they come, and the JSON file rewritten each time."""

    def __init__(self, phase: str, path: Path | None, meta: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"phase": phase, "meta": meta, "runs": [], "summary": {}}

    def run(self, **fields: Any) -> None:
        self.data["runs"].append(fields)
        shown = {k: v for k, v in fields.items() if k != "tokens"}
        print("  " + json.dumps(shown), flush=True)
        self.save()

    def save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps(self.data, indent=1) + "\n")

    def select(self, **match: Any) -> list[dict[str, Any]]:
        return [r for r in self.data["runs"] if all(r.get(k) == v for k, v in match.items())]


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def text(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def long_prompt(engine: Engine, count: int) -> list[int]:
    """``count`` tokens of this repository's own source, as a long prompt would be."""
    source = "\n\n".join(path.read_text() for path in sorted((REPO / "backends").glob("*.py")))
    tokens = engine.target.tokenize(source, add_special=False)
    while len(tokens) < count:
        tokens = tokens + tokens
    return tokens[:count]


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


# -- issue 33: exact kernels ------------------------------------------------------------


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
        source = long_prompt(engines["default"], max(args.prompts))
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


# -- issue 34: the engine's decode tax -----------------------------------------------------


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
    from backends.llamacpp_reference import LlamaCppReference

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


def stopped(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["serve-engine"]:  # the engine process of the tax phase
        apply_knobs()
        from app.main import main as draftpen

        return draftpen(arguments[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    phases = parser.add_subparsers(dest="phase", required=True)
    exact = phases.add_parser("exact", help="exact vs default kernels (issue 33)")
    exact.add_argument("target", type=Path)
    exact.add_argument("draft", type=Path)
    exact.add_argument("--prompts", type=int, nargs="+", default=[1024, 8192])
    tax = phases.add_parser("tax", help="in-process vs engine vs Llama (issue 34)")
    tax.add_argument("target", type=Path)
    tax.add_argument("--context", type=int, default=4096)
    for phase in (exact, tax):
        phase.add_argument("--tokens", type=int, default=128)
        phase.add_argument("--repeats", type=int, default=3)
        phase.add_argument("--json", type=Path, default=None)
        phase.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(arguments)
    os.environ.setdefault("DRAFTPEN_HOME", tempfile.mkdtemp(prefix="dp-measure-home-"))
    meta = {**apply_knobs(), "llama_cpp": llama_cpp.__version__, "started": time.time()}
    results = Results(args.phase, args.json, meta)
    results.save()
    print(f"== {args.phase}: {json.dumps(meta)}", flush=True)
    # Stopped by `timeout`: unwind, so the engine is stopped and the summary written.
    signal.signal(signal.SIGTERM, stopped)
    phase, summarize = {
        "exact": (exact_phase, summarize_exact),
        "tax": (tax_phase, summarize_tax),
    }[args.phase]
    status = 0
    try:
        phase(args, results)
    except (Exception, SystemExit):
        traceback.print_exc()
        results.data["meta"]["error"] = traceback.format_exc()[-2000:]
        status = 1
    finally:  # what was measured is summed up, also after a failure
        results.data["meta"]["seconds"] = round(time.time() - meta["started"], 1)
        try:
            summarize(args, results)
        except Exception:
            traceback.print_exc()
        markdown = results.data.get("markdown") or f"### {args.phase}: no summary\n"
        if status:
            markdown += f"\n(the {args.phase} phase failed: see its JSON's meta.error)\n"
        print(markdown, flush=True)
        if args.markdown is not None:
            with args.markdown.open("a") as file:
                file.write(markdown + "\n")
        results.save()
    return status


if __name__ == "__main__":
    sys.exit(main())
