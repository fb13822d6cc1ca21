"""Run the runtime check in a child process and read its exit.

The child (:mod:`app.runtime_check.probe`) reports each stage on stdout as it reaches
it; this side writes the tiny model, runs the child with a time limit, and turns what
came back into a :class:`RuntimeCheck`: ``ok``, ``crashed`` (a negative return code
is the signal that killed it), ``hung`` (the time limit passed), ``failed`` (a Python
error: the message says which), or ``unavailable`` (llama-cpp-python not installed).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.runtime_check.diagnosis import HANG_CAUSE, HANG_FIX, explain_signal
from app.runtime_check.tiny_model import TinyModel, write_tiny_model

DEFAULT_TIMEOUT_S = 120.0  # ~1 s on an idle 2-core machine; generous for a busy one
STDERR_TAIL_CHARS = 2000
STAGES_IN_WORDS = {
    "started": "while importing llama-cpp-python",
    "imported": "while loading the model",
    "loaded": "while decoding one token at a time",
    "decoded_one_at_a_time": "while decoding a batch",
    "decoded_batch": "after decoding, while shutting down",
}


@dataclass(frozen=True)
class RuntimeCheck:
    """What the child loaded and decoded, or how it died and what to do about it."""

    outcome: str  # "ok", "crashed", "hung", "failed", "unavailable"
    stage: str  # the last stage the child reported ("started" when none)
    summary: str  # one line for people
    model: str | None = None  # what it loaded, in words
    llama_cpp_version: str | None = None
    system_info: str | None = None  # llama.cpp's "CPU : AVX2 = 1 | ..." line
    gpu_offload: bool | None = None
    rpc: bool | None = None  # llama.cpp's RPC backend: can use and be a worker
    # Each drafter with why this build cannot run it (None: it can); None: not reported.
    drafters: dict[str, str | None] | None = None
    n_threads: int | None = None
    tokens_one_at_a_time: int = 0
    batch_tokens: int = 0
    signal: str | None = None  # "SIGSEGV" when crashed
    returncode: int | None = None
    cause: str | None = None
    fix: str | None = None
    error: str | None = None  # the child's Python error when failed
    seconds: float = 0.0
    stderr_tail: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        """Whether every stage ran and gave finite logits."""
        return self.outcome == "ok"

    @property
    def rebuild_may_help(self) -> bool:
        """Crashed or hung: another build of the runtime may run where this one did not."""
        return self.outcome in ("crashed", "hung")

    def as_json(self) -> dict[str, Any]:
        """The check as plain data (``draftpen doctor --json``, the installer)."""
        return asdict(self)


def _read_stages(stdout: str) -> dict[str, dict[str, Any]]:
    """The child's JSON lines by stage; anything else on stdout is ignored."""
    stages: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("stage"), str):
            stages[record["stage"]] = record
    return stages


def _last_stage(stages: Mapping[str, Any]) -> str:
    reached = [stage for stage in STAGES_IN_WORDS if stage in stages]
    return reached[-1] if reached else "started"


def _interpret(
    tiny: TinyModel,
    stdout: str,
    stderr: str,
    returncode: int | None,
    seconds: float,
    timeout_s: float,
) -> RuntimeCheck:
    stages = _read_stages(stdout)
    imported = stages.get("imported", {})
    loaded = stages.get("loaded", {})
    single = stages.get("decoded_one_at_a_time", {})
    batch = stages.get("decoded_batch", {})
    stage = _last_stage(stages)
    facts: dict[str, Any] = {
        "stage": stage,
        "model": tiny.describe() if loaded else None,
        "llama_cpp_version": imported.get("llama_cpp_version"),
        "system_info": imported.get("system_info"),
        "gpu_offload": imported.get("gpu_offload"),
        "rpc": imported.get("rpc"),
        "drafters": imported.get("drafters"),
        "n_threads": loaded.get("n_threads"),
        "tokens_one_at_a_time": int(single.get("tokens", 0)),
        "batch_tokens": int(batch.get("tokens", 0)),
        "returncode": returncode,
        "seconds": round(seconds, 3),
        "stderr_tail": stderr[-STDERR_TAIL_CHARS:],
    }
    if returncode is None:
        return RuntimeCheck(
            outcome="hung",
            summary=f"hung {STAGES_IN_WORDS[stage]}: no result within {timeout_s:g} s",
            cause=HANG_CAUSE,
            fix=HANG_FIX,
            **facts,
        )
    if returncode < 0:
        diagnosis = explain_signal(-returncode)
        return RuntimeCheck(
            outcome="crashed",
            summary=f"crashed: {diagnosis.signal} (signal {-returncode}) {STAGES_IN_WORDS[stage]}",
            signal=diagnosis.signal,
            cause=diagnosis.cause,
            fix=diagnosis.fix,
            **facts,
        )
    error = stages.get("error", {}).get("error")
    if returncode != 0 or error:
        error = error or (stderr.strip().splitlines() or ["no output"])[-1]
        return RuntimeCheck(
            outcome="failed",
            summary=f"failed {STAGES_IN_WORDS[stage]} (exit {returncode}): {error}",
            error=error,
            **facts,
        )
    finite = int(single.get("finite_rows", 0)) + int(batch.get("finite_rows", 0))
    expected = facts["tokens_one_at_a_time"] + facts["batch_tokens"]
    if not batch or finite != expected:
        error = f"{expected - finite} of {expected} logits rows were not finite"
        if not batch:
            error = "the child exited before it reported the batch decode"
        return RuntimeCheck(
            outcome="failed",
            summary=f"failed: {error}",
            error=error,
            fix="rebuild with the portable flags: DRAFTPEN_LLAMA_FLAVOUR=portable "
            "bash packaging/install.sh",
            **facts,
        )
    threads = f", {facts['n_threads']} threads" if facts["n_threads"] else ""
    return RuntimeCheck(
        outcome="ok",
        summary=(
            f"ok: loaded a {tiny.describe()}, decoded {facts['tokens_one_at_a_time']} tokens "
            f"one at a time and a batch of {facts['batch_tokens']} "
            f"(llama-cpp-python {facts['llama_cpp_version']}{threads}, {seconds:.1f} s)"
        ),
        **facts,
    )


def llama_cpp_installed() -> bool:
    """Whether llama-cpp-python can be found (without importing it here)."""
    return importlib.util.find_spec("llama_cpp") is not None


def run_runtime_check(
    *, timeout_s: float = DEFAULT_TIMEOUT_S, env: Mapping[str, str] | None = None
) -> RuntimeCheck:
    """Write the tiny model, decode it in a child process, and say how that went.

    ``env`` replaces the child's environment (the tests pass the crash hook this way);
    by default it inherits this process's.
    """
    if not llama_cpp_installed():
        return RuntimeCheck(
            outcome="unavailable",
            stage="started",
            summary="not run: llama-cpp-python is not installed",
            fix="bash packaging/install.sh installs it, built for this machine",
        )
    with tempfile.TemporaryDirectory(prefix="draftpen-runtime-check-") as directory:
        try:
            tiny = write_tiny_model(Path(directory))
        except ImportError as error:  # an environment from before gguf was a dependency
            return RuntimeCheck(
                outcome="failed",
                stage="started",
                summary=f"not run: the tiny model needs the gguf package ({error})",
                error=str(error),
                fix="reinstall draftpen (bash packaging/install.sh), which brings gguf",
            )
        command = [sys.executable, "-m", "app.runtime_check.probe", str(tiny.path)]
        started = time.perf_counter()
        try:
            # start_new_session: a Ctrl-C at the terminal is for the caller, which then
            # ends the child itself (subprocess.run kills it on the way out).
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=None if env is None else dict(env),
                start_new_session=True,
            )
        except subprocess.TimeoutExpired as expired:
            return _interpret(
                tiny,
                _text(expired.stdout),
                _text(expired.stderr),
                None,
                time.perf_counter() - started,
                timeout_s,
            )
        return _interpret(
            tiny,
            result.stdout,
            result.stderr,
            result.returncode,
            time.perf_counter() - started,
            timeout_s,
        )


def _text(output: str | bytes | None) -> str:
    """``TimeoutExpired`` carries what was read so far, as bytes even in text mode."""
    if output is None:
        return ""
    return output if isinstance(output, str) else output.decode("utf-8", errors="replace")


def render_check(check: RuntimeCheck) -> list[str]:
    """The check as lines for a terminal: the summary, then cause and fix when it failed."""
    lines = [check.summary]
    if check.cause:
        lines.append(f"  cause: {check.cause}")
    if check.fix:
        lines.append(f"  fix:   {check.fix}")
    return lines


def stderr_excerpt(stderr: str, lines: int = 8) -> list[str]:
    """The telling part of a dead child's stderr: from faulthandler's "Fatal Python
    error" line (the innermost frames follow it), else the last few lines."""
    kept = [line for line in stderr.splitlines() if line.strip()]
    kept = [line for line in kept if not line.startswith("Extension modules:")]
    for index, line in enumerate(kept):
        if line.startswith("Fatal Python error"):
            return kept[index : index + lines]
    return kept[-lines:]
