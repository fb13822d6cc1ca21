"""The loop's cost on tiny hybrid targets: host time, rollback, the MTP head (a benchmark).

Writes tiny random-weight ``qwen35`` GGUFs with tests/tiny_hybrid.py (Gated DeltaNet +
attention, SmolLM2's tokenizer): a target with its nextn (MTP) block, the same trunk
without it, and a draft model (that trunk with noise on its weights); and, for
comparison, an attention-only ``qwen3`` model of the same width, depth and vocabulary
with its own noisy draft. Then, in this one process:

1. **The loop**: each target generates with ``--drafter none / ngram / model / mtp`` at
   temperature 0 and at 0.7 (top_p 0.95), fixed K, and the statistics' host time per
   generated token (``host_ms_per_token``: decode time outside the runtimes' forward
   and rollback calls, the figure ``draftpen generate --json`` reports) is read from
   ``Engine.generate``'s statistics, with tok/s. The consumer here does nothing with
   the events; ``generate`` also prints the reply, which counts as host time there.
   The target's and the drafters' runtime calls are timed too (the timers run inside
   the runtime's share of the time, not the host's), which gives what a verify, a
   rollback, a draft-model step and an MTP step cost, and how many checkpoint restores
   and replayed tokens a run needed. One extra target is the hybrid without snapshots
   (``rollback_snapshots=0``): every verify then rolls back by checkpoint and replay.
2. **Rollback, one operation at a time**, on a prompt already read: a 5-token forward
   then dropping 3 of it, by llama.cpp's snapshots, by checkpoint restore (the copy
   before the forward timed apart) and by a KV-cache cut on the attention-only model;
   and the next 1-token forward, which after a restore first replays the kept tokens
   (ahead of the batch, or as a decode of their own where the batch needs a checkpoint
   before it, as every verify does without snapshots).

Random weights say nothing about acceptance, and so nothing about speed-ups: the tiny
models' acceptance figures are printed only to show what each run did. The host and
per-operation costs are this loop's and this runtime's own. Each figure is the median
(and the fastest) of the repeats, with the one-minute load average during them: the
machine may be shared. llama.cpp runs one thread by default: on a shared 2-core
machine two threads wait on each other behind whatever else runs (a tiny model's
decode took ~390 ms instead of ~1.4 ms here), and one thread is what a model this
small needs.

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        nice -n 10 python benchmarks/hybrid_loop_cost.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.sampling import SamplingParams
from tests.model_files import SMOLLM2_KEY, require_model
from tests.tiny_hybrid import (
    HEAD_DIM,
    N_EMBD,
    N_FF,
    N_HEAD,
    N_HEAD_KV,
    finish_gguf,
    perturbed,
    tiny_qwen35_tensors,
    write_tiny_qwen35,
)

PROMPT = "Write a Python function that reverses a list, and explain how it works."
SETTINGS = {
    "T0": SamplingParams(temperature=0.0, seed=1),
    "T0.7": SamplingParams(temperature=0.7, top_p=0.95, seed=1),
}
CONTEXT = 1024
DRAFT_SCALE = 0.1  # the draft model's weight noise, relative (as tests/test_hybrid_targets.py)
MICRO_PROMPT = "The sea is wide and the waves are high, the wind is strong and the night is long"


# -- the models ---------------------------------------------------------------------------


def attention_only_tensors(hybrid: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """A ``qwen3`` model of the hybrid's size: its embeddings, head, norms and FFNs, and a
    plain attention block (q, k, v, o with q/k norms) in every layer."""
    rng = np.random.default_rng(seed)
    tensors = {
        name: hybrid[name] for name in ("token_embd.weight", "output_norm.weight", "output.weight")
    }
    layers = sorted({int(name.split(".")[1]) for name in hybrid if name.startswith("blk.")})
    for layer in layers:
        prefix = f"blk.{layer}"
        tensors[f"{prefix}.attn_norm.weight"] = hybrid[f"{prefix}.attn_norm.weight"]
        tensors[f"{prefix}.ffn_norm.weight"] = hybrid[f"{prefix}.post_attention_norm.weight"]
        for part in ("ffn_gate", "ffn_up", "ffn_down"):
            tensors[f"{prefix}.{part}.weight"] = hybrid[f"{prefix}.{part}.weight"]
        shapes = {
            "attn_q": (HEAD_DIM * N_HEAD, N_EMBD),
            "attn_k": (HEAD_DIM * N_HEAD_KV, N_EMBD),
            "attn_v": (HEAD_DIM * N_HEAD_KV, N_EMBD),
            "attn_output": (N_EMBD, HEAD_DIM * N_HEAD),
        }
        for part, shape in shapes.items():
            values = rng.standard_normal(shape).astype(np.float32) * 0.05
            tensors[f"{prefix}.{part}.weight"] = values
        tensors[f"{prefix}.attn_q_norm.weight"] = np.ones(HEAD_DIM, dtype=np.float32)
        tensors[f"{prefix}.attn_k_norm.weight"] = np.ones(HEAD_DIM, dtype=np.float32)
    return tensors


def write_attention_only(
    path: Path, tokenizer_source: Path, tensors: dict[str, np.ndarray]
) -> Path:
    """Write a ``qwen3`` GGUF with ``tokenizer_source``'s tokenizer (as tiny_hybrid does)."""
    import gguf

    reader = gguf.GGUFReader(tokenizer_source)
    arch = "qwen3"
    layers = len({name.split(".")[1] for name in tensors if name.startswith("blk.")})
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    writer.add_uint32(f"{arch}.context_length", 4096)
    writer.add_uint32(f"{arch}.embedding_length", N_EMBD)
    writer.add_uint32(f"{arch}.block_count", layers)
    writer.add_uint32(f"{arch}.feed_forward_length", N_FF)
    writer.add_uint32(f"{arch}.attention.head_count", N_HEAD)
    writer.add_uint32(f"{arch}.attention.head_count_kv", N_HEAD_KV)
    writer.add_uint32(f"{arch}.attention.key_length", HEAD_DIM)
    writer.add_uint32(f"{arch}.attention.value_length", HEAD_DIM)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{arch}.rope.freq_base", 10_000_000.0)
    finish_gguf(writer, reader, tensors)
    return path


@dataclass(frozen=True)
class TinyFiles:
    """The GGUFs one run writes."""

    hybrid_mtp: Path
    hybrid: Path
    hybrid_draft: Path
    attention: Path
    attention_draft: Path


def write_files(folder: Path) -> TinyFiles:
    """Write every tiny model into ``folder``."""
    import gguf

    tokenizer = require_model(SMOLLM2_KEY)
    n_vocab = len(gguf.GGUFReader(tokenizer).fields["tokenizer.ggml.tokens"].contents())
    # One seed: the trunk is the same with and without the nextn block after it.
    weights = tiny_qwen35_tensors(n_vocab, seed=1, nextn_layers=1)
    trunk = {name: values for name, values in weights.items() if not name.startswith("blk.2.")}
    attention = attention_only_tensors(trunk, seed=2)
    return TinyFiles(
        hybrid_mtp=write_tiny_qwen35(
            folder / "tiny-qwen35-mtp.gguf", tokenizer, nextn_layers=1, tensors=weights
        ),
        hybrid=write_tiny_qwen35(folder / "tiny-qwen35.gguf", tokenizer, tensors=trunk),
        hybrid_draft=write_tiny_qwen35(
            folder / "tiny-qwen35-draft.gguf",
            tokenizer,
            tensors=perturbed(trunk, seed=7, scale=DRAFT_SCALE),
        ),
        attention=write_attention_only(folder / "tiny-qwen3.gguf", tokenizer, attention),
        attention_draft=write_attention_only(
            folder / "tiny-qwen3-draft.gguf",
            tokenizer,
            perturbed(attention, seed=7, scale=DRAFT_SCALE),
        ),
    )


# -- timing the runtime calls ------------------------------------------------------------


@dataclass
class CallTimes:
    """Seconds of each call of one kind, with how many tokens it carried."""

    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def total(self) -> float:
        return sum(self.seconds)

    def median_ms(self, where: Callable[[int], bool] = lambda count: True) -> float | None:
        chosen = [s for s, n in zip(self.seconds, self.tokens, strict=True) if where(n)]
        return 1e3 * statistics.median(chosen) if chosen else None


class Timers:
    """Wraps a model's runtime calls (instance attributes) and records their times."""

    def __init__(self) -> None:
        self.calls: dict[str, CallTimes] = {}

    def wrap(self, owner: Any, method: str, label: str, count: Callable[..., int]) -> None:
        original = getattr(owner, method)
        record = self.calls.setdefault(label, CallTimes())

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = original(*args, **kwargs)
            record.seconds.append(time.perf_counter() - started)
            record.tokens.append(count(*args, **kwargs))
            return result

        setattr(owner, method, timed)

    def reset(self) -> None:
        for record in self.calls.values():
            record.seconds.clear()
            record.tokens.clear()


def _tokens_in(tokens: Any, *args: Any, **kwargs: Any) -> int:
    return len(tokens)


def _one(*args: Any, **kwargs: Any) -> int:
    return 1


def instrument(engine: Engine) -> Timers:
    """Time the target's forwards and rollbacks, its checkpoint copies and restores, the
    draft model's steps, checkpoints and rollbacks, and the MTP head's start and steps."""
    timers = Timers()
    target, draft = engine.target, engine.draft
    timers.wrap(target, "forward", "target forward", _tokens_in)
    timers.wrap(target, "rollback", "target rollback", _one)
    recurrent = getattr(target, "_recurrent", None)
    if recurrent is not None:
        timers.wrap(recurrent, "_checkpoint", "target checkpoint", _one)
        timers.wrap(recurrent, "_restore", "target restore", _one)
    if draft is not None:
        timers.wrap(draft, "forward", "draft forward", _tokens_in)
        timers.wrap(draft, "rollback", "draft rollback", _one)
        timers.wrap(draft, "keep_rollback_point", "draft keep point", _one)
    head = target.mtp_head() if getattr(target, "mtp_layers", 0) else None
    if head is not None:
        timers.wrap(head, "start", "mtp start", _one)
        timers.wrap(head, "step", "mtp step", _one)
    return timers


# -- the loop -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopRun:
    """One generation's figures."""

    target: str
    drafter: str
    setting: str
    generated: int
    host_ms_per_token: float
    host_ms_per_round: float
    tokens_per_second: float
    acceptance: float
    tokens_per_pass: float
    drafted: int
    load: float
    # From the timers (ms; None where there was no such call).
    verify_ms: float | None
    verify_tokens: float | None
    single_forward_ms: float | None
    rollback_ms_per_token: float
    restores: int
    replayed_tokens: int
    checkpoint_ms: float | None
    restore_ms: float | None
    draft_step_ms: float | None
    draft_keep_point_ms: float | None
    draft_rollback_ms_per_token: float | None
    mtp_start_ms: float | None
    mtp_step_ms: float | None
    mtp_ms_per_drafted: float | None


@dataclass(frozen=True)
class Target:
    """A target to generate with, and which drafters it runs."""

    label: str
    path: Path
    draft: Path
    drafters: tuple[str, ...]
    snapshots: int | None = None


def load_engine(target: Target, threads: int) -> Engine:
    from backends.llamacpp import LlamaCppModel

    def load(path: Path, snapshots: int | None = None) -> Any:
        return LlamaCppModel(path, n_ctx=CONTEXT, n_threads=threads, rollback_snapshots=snapshots)

    return Engine(load(target.path, target.snapshots), load(target.draft))


def run_loop(
    engine: Engine,
    timers: Timers,
    target: Target,
    drafter: str,
    setting: str,
    prompt: list[int],
    args: argparse.Namespace,
) -> LoopRun:
    """One generation, with the timers' figures for it."""
    timers.reset()
    recurrent = getattr(engine.target, "_recurrent", None)
    restores_before = recurrent.restores if recurrent is not None else 0
    replayed_before = recurrent.replayed_tokens if recurrent is not None else 0
    request = GenerationRequest(
        prompt_tokens=tuple(prompt),
        params=SETTINGS[setting],
        max_tokens=args.max_tokens,
        drafter=drafter,
        draft_tokens=args.draft_tokens,
    )
    load = os.getloadavg()[0]
    events = list(engine.generate(request))
    load = max(load, os.getloadavg()[0])
    stats = events[-1].stats
    calls = timers.calls
    forwards = calls["target forward"]
    drafted = sum(event.draft_length for event in events if event.drafter == "mtp")
    mtp_seconds = (
        calls["mtp start"].total() + calls["mtp step"].total() if "mtp start" in calls else 0.0
    )
    verifies = [n for n in forwards.tokens if n > 1]

    def median(label: str, where: Callable[[int], bool] = lambda count: True) -> float | None:
        return calls[label].median_ms(where) if label in calls else None

    return LoopRun(
        target=target.label,
        drafter=drafter,
        setting=setting,
        generated=stats.generated_tokens,
        host_ms_per_token=stats.host_ms_per_token,
        host_ms_per_round=1e3 * stats.host_seconds / stats.rounds if stats.rounds else 0.0,
        tokens_per_second=stats.decode_tokens_per_second,
        acceptance=stats.acceptance_rate,
        tokens_per_pass=stats.tokens_per_target_pass,
        drafted=stats.drafted,
        load=load,
        verify_ms=forwards.median_ms(lambda count: count > 1),
        verify_tokens=statistics.median(verifies) if verifies else None,
        single_forward_ms=forwards.median_ms(lambda count: count == 1),
        rollback_ms_per_token=1e3 * calls["target rollback"].total() / stats.generated_tokens,
        restores=(recurrent.restores - restores_before) if recurrent is not None else 0,
        replayed_tokens=(
            (recurrent.replayed_tokens - replayed_before) if recurrent is not None else 0
        ),
        checkpoint_ms=median("target checkpoint"),
        restore_ms=median("target restore"),
        draft_step_ms=median("draft forward", lambda count: count == 1),
        draft_keep_point_ms=median("draft keep point"),
        draft_rollback_ms_per_token=(
            1e3 * calls["draft rollback"].total() / stats.generated_tokens
            if calls.get("draft rollback") and calls["draft rollback"].seconds
            else None
        ),
        mtp_start_ms=median("mtp start"),
        mtp_step_ms=median("mtp step"),
        mtp_ms_per_drafted=1e3 * mtp_seconds / drafted if drafted else None,
    )


# -- rollback, one operation at a time -----------------------------------------------------


@dataclass(frozen=True)
class MicroResult:
    """Per-operation times (ms, median and fastest) on one model."""

    model: str
    operation: str
    median_ms: float
    fastest_ms: float
    samples: int
    load: float
    note: str = ""


def micro_rollback(
    label: str, path: Path, snapshots: int | None, threads: int, repeats: int
) -> list[MicroResult]:
    """Forward 5 tokens, drop 3 of them, forward 1: each step timed, ``repeats`` times."""
    from backends.llamacpp import LlamaCppModel

    model = LlamaCppModel(path, n_ctx=CONTEXT, n_threads=threads, rollback_snapshots=snapshots)
    try:
        recurrent = model._recurrent
        checkpoint_times: list[float] = []
        if recurrent is not None:
            copy = recurrent._checkpoint

            def timed_copy() -> Any:
                started = time.perf_counter()
                result = copy()
                checkpoint_times.append(time.perf_counter() - started)
                return result

            recurrent._checkpoint = timed_copy
        words = model.tokenize(MICRO_PROMPT)
        model.prefill(words)
        checkpoint_times.clear()  # the prompt's anchor is not a round's cost
        times: dict[str, list[float]] = {"forward 1": [], "forward 5": [], "drop 3 of 5": []}
        after: list[float] = []
        mode = (
            "KV cut"
            if recurrent is None
            else ("snapshot" if recurrent.snapshots else "checkpoint restore")
        )
        load = os.getloadavg()[0]
        token = 300
        for _ in range(repeats):
            started = time.perf_counter()
            model.forward([token])
            times["forward 1"].append(time.perf_counter() - started)
            base = len(model.cached_tokens)
            batch = [token + offset for offset in range(1, 6)]
            started = time.perf_counter()
            model.forward(batch)
            times["forward 5"].append(time.perf_counter() - started)
            started = time.perf_counter()
            model.rollback(base + 2)
            times["drop 3 of 5"].append(time.perf_counter() - started)
            started = time.perf_counter()
            model.forward([token + 9])
            after.append(time.perf_counter() - started)
            token = 300 + (token + 7) % 50
            if len(model.cached_tokens) > CONTEXT - 16:
                break
        load = max(load, os.getloadavg()[0])
        results = [
            MicroResult(label, name, 1e3 * statistics.median(s), 1e3 * min(s), len(s), load)
            for name, s in (
                ("forward 1", times["forward 1"]),
                ("forward 5", times["forward 5"]),
                (f"drop 3 of the 5 ({mode})", times["drop 3 of 5"]),
                ("next forward 1 after the drop", after),
            )
        ]
        if recurrent is not None and not recurrent.snapshots:
            last = results[-1]
            results[-1] = MicroResult(
                last.model,
                last.operation,
                last.median_ms,
                last.fastest_ms,
                last.samples,
                load,
                "includes replaying the 2 kept tokens (a decode of its own)",
            )
        if checkpoint_times:
            size = copy().payload.nbytes  # one more copy, untimed: its size
            results.append(
                MicroResult(
                    label,
                    "checkpoint copy (inside forward 5)",
                    1e3 * statistics.median(checkpoint_times),
                    1e3 * min(checkpoint_times),
                    len(checkpoint_times),
                    load,
                    f"{size:,} bytes",
                )
            )
        return results
    finally:
        model.close()


# -- reporting ------------------------------------------------------------------------------


def _cell(values: list[float], digits: int = 3) -> str:
    """Median (fastest) of ``values``; '-' when empty."""
    if not values:
        return "-"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f})"


def _median(values: list[float | None], digits: int = 3) -> str:
    present = [value for value in values if value is not None]
    return f"{statistics.median(present):.{digits}f}" if present else "-"


def machine_line(threads: int) -> str:
    import llama_cpp

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next(
                line.split(":", 1)[1].strip() for line in info if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return (
        f"{cpu}, {os.cpu_count()} CPUs; llama-cpp-python {llama_cpp.__version__}, "
        f"{threads} llama.cpp thread(s); draftpen {commit or '?'}"
    )


def report(
    runs: list[LoopRun], micro: list[MicroResult], args: argparse.Namespace
) -> Iterator[str]:
    """The text report."""
    yield "The loop's cost on tiny random-weight hybrid (qwen35) targets, CPU"
    yield machine_line(args.threads)
    yield (
        f"{args.max_tokens} tokens per run, K={args.draft_tokens}, {args.repeats} repeats; "
        "median (fastest); load = the one-minute load average during the runs"
    )
    yield (
        "RANDOM WEIGHTS: acceptance and tokens per pass say nothing about real models, and "
        "so neither do tok/s or speed-ups. The host and per-call costs are the loop's and "
        "the runtime's own, on models whose LM head (49,152 x 256) is most of a step."
    )
    yield ""
    yield (
        "1. Host time (outside the runtime calls) per generated token and per round (one "
        "target pass), and what the runs did; restores and replayed tokens are the target's "
        "(a run's first rollback, back to the prompt the run before it shared, included)"
    )
    header = (
        f"{'target':<26} {'drafter':<7} {'setting':<5} {'host ms/token':>15} "
        f"{'host ms/round':>15} {'tok/s':>6} {'accept':>6} {'tok/pass':>8} "
        f"{'restores':>8} {'replayed':>8} {'load':>9}"
    )
    yield header
    groups: dict[tuple[str, str, str], list[LoopRun]] = {}
    for run in runs:
        groups.setdefault((run.target, run.drafter, run.setting), []).append(run)
    for (target, drafter, setting), done in groups.items():
        loads = [run.load for run in done]
        yield (
            f"{target:<26} {drafter:<7} {setting:<5} "
            f"{_cell([run.host_ms_per_token for run in done]):>15} "
            f"{_cell([run.host_ms_per_round for run in done]):>15} "
            f"{statistics.median(run.tokens_per_second for run in done):6.0f} "
            f"{statistics.median(run.acceptance for run in done):6.2f} "
            f"{statistics.median(run.tokens_per_pass for run in done):8.2f} "
            f"{statistics.median(run.restores for run in done):8.0f} "
            f"{statistics.median(run.replayed_tokens for run in done):8.0f} "
            f"{min(loads):4.1f}-{max(loads):<4.1f}"
        )
    yield ""
    yield (
        "2. What the runtime calls cost inside those runs (ms; medians over the runs' calls, "
        "but rollbacks per generated token: the target's, and the draft model's)"
    )
    yield (
        f"{'target':<26} {'drafter':<7} {'setting':<5} {'1-tok fwd':>9} {'verify':>7} "
        f"{'(tokens)':>8} {'rollback/tok':>12} {'ckpt':>6} {'restore':>7} "
        f"{'draft step':>10} {'keep pt':>7} {'d rb/tok':>8} {'mtp start':>9} "
        f"{'mtp step':>8} {'mtp/drafted':>11}"
    )
    for (target, drafter, setting), done in groups.items():
        yield (
            f"{target:<26} {drafter:<7} {setting:<5} "
            f"{_median([run.single_forward_ms for run in done]):>9} "
            f"{_median([run.verify_ms for run in done]):>7} "
            f"{_median([run.verify_tokens for run in done], 0):>8} "
            f"{_median([run.rollback_ms_per_token for run in done], 4):>12} "
            f"{_median([run.checkpoint_ms for run in done]):>6} "
            f"{_median([run.restore_ms for run in done]):>7} "
            f"{_median([run.draft_step_ms for run in done]):>10} "
            f"{_median([run.draft_keep_point_ms for run in done]):>7} "
            f"{_median([run.draft_rollback_ms_per_token for run in done], 4):>8} "
            f"{_median([run.mtp_start_ms for run in done]):>9} "
            f"{_median([run.mtp_step_ms for run in done]):>8} "
            f"{_median([run.mtp_ms_per_drafted for run in done]):>11}"
        )
    mtp_runs = [run for run in runs if run.drafter == "mtp" and run.mtp_ms_per_drafted]
    plain = [
        run.single_forward_ms
        for run in runs
        if run.drafter == "none" and run.target == "hybrid + MTP" and run.single_forward_ms
    ]
    if mtp_runs and plain:
        per_drafted = statistics.median(run.mtp_ms_per_drafted or 0.0 for run in mtp_runs)
        step = statistics.median(run.mtp_step_ms or 0.0 for run in mtp_runs)
        verify = statistics.median(run.verify_ms or 0.0 for run in mtp_runs)
        one = statistics.median(plain)
        yield (
            f"MTP head: {per_drafted:.3f} ms per drafted token (its chained step alone "
            f"{step:.3f}) against a {verify:.3f} ms verify of {args.draft_tokens + 1} "
            f"tokens and a {one:.3f} ms one-token target step: a step costs "
            f"{step / one:.2f} of a target step here (the shared 49,152-row LM head is most "
            "of both)"
        )
    yield ""
    yield "3. Rollback, one operation at a time (ms; prompt read, then repeated)"
    yield f"{'model':<34} {'operation':<48} {'median':>8} {'fastest':>8} {'n':>4} {'load':>5}"
    for result in micro:
        yield (
            f"{result.model:<34} {result.operation:<48} {result.median_ms:8.3f} "
            f"{result.fastest_ms:8.3f} {result.samples:4d} {result.load:5.1f}"
            + (f"  {result.note}" if result.note else "")
        )


def main() -> None:
    """Write the models, run every cell, print the report (and save JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads per model")
    parser.add_argument("--micro-repeats", type=int, default=40)
    parser.add_argument("--json", type=Path, default=None, help="also write the runs here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tiny-hybrid-") as folder:
        started = time.perf_counter()
        files = write_files(Path(folder))
        print(f"# wrote the tiny models in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        targets = [
            Target("hybrid", files.hybrid, files.hybrid_draft, ("none", "ngram", "model")),
            Target(
                "hybrid + MTP",
                files.hybrid_mtp,
                files.hybrid_draft,
                ("none", "ngram", "model", "mtp"),
            ),
            Target(
                "hybrid, no snapshots",
                files.hybrid,
                files.hybrid_draft,
                ("ngram", "model"),
                snapshots=0,
            ),
            Target(
                "attention-only",
                files.attention,
                files.attention_draft,
                ("none", "ngram", "model"),
            ),
        ]
        runs: list[LoopRun] = []
        for target in targets:
            engine = load_engine(target, args.threads)
            try:
                timers = instrument(engine)
                prompt = engine.chat_prompt([ChatMessage("user", PROMPT)])
                for repeat in range(args.repeats):
                    for setting in SETTINGS:
                        # Rotate the drafters' order so none always runs first.
                        shift = repeat % len(target.drafters)
                        for drafter in target.drafters[shift:] + target.drafters[:shift]:
                            run = run_loop(engine, timers, target, drafter, setting, prompt, args)
                            runs.append(run)
                            print(
                                f"# {target.label}, {drafter}, {setting}: host "
                                f"{run.host_ms_per_token:.3f} ms/token, "
                                f"{run.tokens_per_second:.0f} tok/s, load {run.load:.2f}",
                                file=sys.stderr,
                                flush=True,
                            )
            finally:
                engine.close()
        micro: list[MicroResult] = []
        for label, path, snapshots in (
            ("attention-only", files.attention, None),
            ("hybrid, snapshots (16)", files.hybrid, None),
            ("hybrid, no snapshots", files.hybrid, 0),
        ):
            micro.extend(micro_rollback(label, path, snapshots, args.threads, args.micro_repeats))
    for line in report(runs, micro, args):
        print(line)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine_line(args.threads),
                    "max_tokens": args.max_tokens,
                    "repeats": args.repeats,
                    "draft_tokens": args.draft_tokens,
                    "runs": [asdict(run) for run in runs],
                    "rollback_operations": [asdict(result) for result in micro],
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
