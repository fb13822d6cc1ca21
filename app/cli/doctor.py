"""``draftpen doctor``: what this machine is, which runtimes it has, which one runs.

The facts are gathered once into :class:`DoctorReport` and rendered as lines, so
the rendering is tested with made-up machines.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
from dataclasses import dataclass

import psutil

from app.machine import cpu_model
from backends.select import RuntimeFacts, decide_runtime, detect_facts


@dataclass(frozen=True)
class DoctorReport:
    """Everything ``draftpen doctor`` prints."""

    os_name: str
    chip: str
    memory_gib: float
    gpus: tuple[str, ...]  # "NVIDIA H100, 81559 MiB"; empty when nvidia-smi finds none
    facts: RuntimeFacts
    llama_cpp_gpu_offload: bool | None  # None: llama.cpp not installed or not loadable
    mlx_device: str | None  # "gpu" / "cpu"; None: mlx not installed or not loadable


def _chip() -> str:
    if platform.system() == "Darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return cpu_model()


def _nvidia_gpus() -> tuple[str, ...]:
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in output.splitlines() if line.strip())


def _llama_cpp_gpu_offload(facts: RuntimeFacts) -> bool | None:
    if not facts.llama_cpp_version:
        return None
    try:
        from backends.llamacpp import supports_gpu_offload

        return supports_gpu_offload()
    except Exception:  # a report, not a requirement: a broken install shows as unknown
        return None


def _mlx_device(facts: RuntimeFacts) -> str | None:
    if not facts.mlx_version:
        return None
    try:
        from backends.mlx_lm_backend import uses_gpu

        return "gpu" if uses_gpu() else "cpu"
    except Exception:  # as above
        return None


def gather_report() -> DoctorReport:
    """Look at this machine (loads each runtime's library, not any model)."""
    facts = detect_facts()
    return DoctorReport(
        os_name=platform.platform(),
        chip=_chip(),
        memory_gib=round(psutil.virtual_memory().total / 2**30, 1),
        gpus=_nvidia_gpus(),
        facts=facts,
        llama_cpp_gpu_offload=_llama_cpp_gpu_offload(facts),
        mlx_device=_mlx_device(facts),
    )


def render_report(report: DoctorReport) -> list[str]:
    """The lines ``draftpen doctor`` prints."""
    facts = report.facts
    if facts.llama_cpp_version is None:
        llama = "not installed"
    else:
        offload = {True: "GPU offload", False: "CPU only", None: "GPU offload unknown"}
        llama = f"{facts.llama_cpp_version} ({offload[report.llama_cpp_gpu_offload]})"
    if facts.mlx_version is None:
        mlx = "not installed"
    else:
        mlx = f"{facts.mlx_version} (device: {report.mlx_device or 'unknown'})"
    decision = decide_runtime(facts)
    return [
        f"OS:         {report.os_name}",
        f"chip:       {report.chip}" + (" (Apple Silicon)" if facts.apple_silicon else ""),
        f"memory:     {report.memory_gib} GiB",
        f"GPU:        {'; '.join(report.gpus) if report.gpus else 'no NVIDIA GPU found'}",
        f"llama.cpp:  {llama}",
        f"mlx:        {mlx}",
        f"runtime:    {decision.runtime} ({decision.reason}); override with --runtime",
    ]


def run_doctor(args: argparse.Namespace) -> int:
    """``draftpen doctor``: print what was detected and which runtime would be used."""
    for line in render_report(gather_report()):
        print(line)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` subcommand."""
    doctor = commands.add_parser("doctor", help="show this machine and the runtime it would use")
    doctor.set_defaults(func=run_doctor)
