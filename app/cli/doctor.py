"""``draftpen doctor``: what this machine is, which runtimes it has, which one runs.

The facts are gathered once into :class:`DoctorReport` and rendered as lines (or, with
``--json``, as data), so the rendering is tested with made-up machines. Among them, the
drafters each runtime runs here (:mod:`app.cli.doctor_drafters`). llama.cpp is
never loaded in this process: the runtime check (:mod:`app.runtime_check`) loads it in
a child, so a build that crashes on this CPU is reported, not suffered.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from app.calibration_store import StoredCalibration, stored_calibrations
from app.cli.doctor_calibrations import calibration_lines, calibrations_json
from app.cli.doctor_drafters import drafter_lines, drafters_json, mlx_drafters
from app.machine import cpu_model
from app.runtime_check.check import RuntimeCheck, render_check, run_runtime_check, stderr_excerpt
from app.runtime_check.cpu_features import FeatureUse, cpu_flags, feature_uses
from app.runtime_check.install_record import InstallCheck, read_install_check
from backends.select import RuntimeFacts, decide_runtime, detect_facts
from backends.workers.wire import PROTOCOL, version_text

# Exit status when the runtime check crashed, hung or failed: scripts can tell.
EXIT_RUNTIME_BROKEN = 1


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
    cpu_features: tuple[FeatureUse, ...] = ()  # AVX2, AVX-512, AMX: CPU and build
    runtime_check: RuntimeCheck | None = None  # None: not run
    # The installer's own check of this environment's build; None: none recorded.
    install_check: InstallCheck | None = None
    # The cost curves `auto` decides with, one per pair loaded here.
    calibrations: tuple[StoredCalibration, ...] = ()
    # MLX's drafters, each with why it cannot run (None: it runs); None: no mlx here.
    # llama.cpp's come with its runtime check.
    mlx_drafters: dict[str, str | None] | None = None


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


def _mlx_device(facts: RuntimeFacts) -> str | None:
    if not facts.mlx_version:
        return None
    try:
        from backends.mlx.model import uses_gpu

        return "gpu" if uses_gpu() else "cpu"
    except Exception:  # as above
        return None


def gather_report() -> DoctorReport:
    """Look at this machine: mlx's library here, llama.cpp's in the runtime check's child
    process (which loads a tiny model and decodes with it)."""
    facts = detect_facts()
    check = run_runtime_check()
    return DoctorReport(
        os_name=platform.platform(),
        chip=_chip(),
        memory_gib=round(psutil.virtual_memory().total / 2**30, 1),
        gpus=_nvidia_gpus(),
        facts=facts,
        llama_cpp_gpu_offload=check.gpu_offload,
        mlx_device=_mlx_device(facts),
        cpu_features=feature_uses(cpu_flags(), check.system_info),
        runtime_check=check,
        install_check=read_install_check(),
        calibrations=tuple(stored_calibrations()),
        mlx_drafters=mlx_drafters(facts),
    )


def _yes_no(value: bool | None, yes: str, no: str) -> str:
    return "unknown" if value is None else (yes if value else no)


def _feature_lines(features: tuple[FeatureUse, ...]) -> list[str]:
    if not features:
        return []
    lines = ["CPU features (this CPU / this llama.cpp build):"]
    for feature in features:
        cpu = _yes_no(feature.cpu, "yes", "no")
        build = _yes_no(feature.build, "used", "not used")
        line = f"  {feature.name + ':':<9} {cpu} / {build}"
        lines.append(f"{line}  ({feature.note})" if feature.note else line)
    return lines


def _check_lines(check: RuntimeCheck | None) -> list[str]:
    if check is None:
        return []
    rendered = render_check(check)
    lines = [f"runtime check: {rendered[0]}", *rendered[1:]]
    if not check.ok:
        excerpt = stderr_excerpt(check.stderr_tail, lines=6)
        lines += ["  its error output:", *(f"    {line}" for line in excerpt)] if excerpt else []
    return lines


def _install_lines(report: DoctorReport) -> list[str]:
    """The installer's check, beside doctor's own (none where doctor ran no check)."""
    if report.runtime_check is None:
        return []
    if report.install_check is None:
        return [
            "installer:  no runtime check recorded in this environment (installed without "
            "packaging/install.sh or test.sh; the check below is doctor's own)"
        ]
    return [f"installer:  {report.install_check.describe()}"]


def _worker_lines(check: RuntimeCheck | None) -> list[str]:
    """Whether this build can split a target over workers, and be one."""
    if check is None or check.rpc is None:
        return []
    if check.rpc:
        return [
            "workers:    yes: this build can use `draftpen worker`s (serve --workers) and "
            f"be one (llama.cpp RPC {version_text(PROTOCOL)})"
        ]
    return [
        "workers:    no: this llama-cpp-python has no RPC backend; run packaging/install.sh "
        "again to rebuild it with -DGGML_RPC=ON"
    ]


def _llamacpp_drafters(report: DoctorReport) -> dict[str, str | None] | None:
    """What the runtime check's child found the library runs (None: it did not say)."""
    return None if report.runtime_check is None else report.runtime_check.drafters


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
        *_worker_lines(report.runtime_check),
        *drafter_lines(_llamacpp_drafters(report), report.mlx_drafters),
        *_feature_lines(report.cpu_features),
        *_install_lines(report),
        *_check_lines(report.runtime_check),
        *calibration_lines(report.calibrations),
    ]


def report_json(report: DoctorReport) -> dict[str, Any]:
    """The report as data (``draftpen doctor --json``): the same facts as the lines."""
    facts = report.facts
    decision = decide_runtime(facts)
    check = report.runtime_check
    return {
        "os": report.os_name,
        "chip": report.chip,
        "apple_silicon": facts.apple_silicon,
        "memory_gib": report.memory_gib,
        "gpus": list(report.gpus),
        "llama_cpp": {
            "version": facts.llama_cpp_version,
            "gpu_offload": report.llama_cpp_gpu_offload,
            "rpc": None if report.runtime_check is None else report.runtime_check.rpc,
        },
        "mlx": {"version": facts.mlx_version, "device": report.mlx_device},
        "runtime": {"name": decision.runtime, "reason": decision.reason},
        "cpu_features": [asdict(feature) for feature in report.cpu_features],
        "runtime_check": None if check is None else check.as_json(),
        "install_check": None if report.install_check is None else report.install_check.as_json(),
        "calibrations": calibrations_json(report.calibrations),
        "drafters": drafters_json(_llamacpp_drafters(report), report.mlx_drafters),
    }


def run_doctor(args: argparse.Namespace) -> int:
    """``draftpen doctor``: print what was detected, which runtime would be used, and
    whether llama.cpp runs here; exit 1 when its runtime check crashed, hung or failed."""
    report = gather_report()
    if args.json:
        print(json.dumps(report_json(report), indent=2))
    else:
        for line in render_report(report):
            print(line)
    check = report.runtime_check
    broken = check is not None and check.outcome in ("crashed", "hung", "failed")
    return EXIT_RUNTIME_BROKEN if broken else 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` subcommand."""
    doctor = commands.add_parser(
        "doctor",
        help="show this machine, the runtime it would use, and whether that runtime runs",
        description="Show this machine, the runtime draftpen would use, the CPU features "
        "that matter (this CPU and the llama.cpp build), and a runtime check: a tiny model "
        "decoded in a child process.",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(func=run_doctor)
