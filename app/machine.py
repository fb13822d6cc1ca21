"""What this machine is: for bench reports and calibration keys."""

from __future__ import annotations

import platform
from pathlib import Path

import psutil


def cpu_model() -> str:
    """The CPU's model name, as the OS reports it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_description() -> dict[str, object]:
    """Platform, CPU, cores, memory, Python, and whether llama.cpp can use a GPU."""
    description: dict[str, object] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
    }
    try:
        from backends.llamacpp.ggml_devices import supports_gpu_offload

        description["llama_cpp_gpu_offload"] = supports_gpu_offload()
    except Exception as error:  # a description, not a requirement
        description["llama_cpp_gpu_offload"] = f"unknown ({error})"
    return description
