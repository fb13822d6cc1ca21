"""The CPU features that decide which llama.cpp kernels run, on this CPU and in the build.

The CPU's side comes from /proc/cpuinfo on Linux (``DRAFTPEN_CPUINFO`` names another
file, for tests) or sysctl on macOS; the build's side from llama.cpp's system info
line (``AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | ...``), which lists what ggml was
compiled with. The two disagree in telling ways: a build using what the CPU lacks dies
by SIGILL; AMX on the CPU but not in the build is draftpen's choice (llama.cpp #20824).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

CPUINFO_ENV = "DRAFTPEN_CPUINFO"
# (shown name, the CPU flags that make it, the system info key of a build that uses it)
FEATURES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("AVX2", ("avx2",), "AVX2"),
    ("AVX-512", ("avx512f",), "AVX512"),
    ("AMX", ("amx_tile", "amx_int8"), "AMX_INT8"),
)
AMX_LEFT_OUT = (
    "left out of the build on purpose: ggml's AMX matmul crashes on the first batched "
    "decode (llama.cpp #20824); DRAFTPEN_LLAMA_AMX=1 bash packaging/install.sh builds it in"
)
AMX_BUILT_IN = (
    "built in (DRAFTPEN_LLAMA_AMX=1?): ggml's AMX matmul crashes on some machines "
    "(llama.cpp #20824); the runtime check below says whether it runs here"
)


@dataclass(frozen=True)
class FeatureUse:
    """One instruction set: whether this CPU has it and whether the build uses it."""

    name: str  # "AVX2", "AVX-512", "AMX"
    cpu: bool | None  # None: unknown, or not an x86-64 CPU
    build: bool | None  # None: unknown (the runtime did not report its system info)
    note: str = ""


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def cpu_flags() -> frozenset[str] | None:
    """This CPU's instruction-set flags, lower case; ``None`` where none can be read."""
    cpuinfo = Path(os.environ.get(CPUINFO_ENV) or "/proc/cpuinfo")
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            output = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.features", "machdep.cpu.leaf7_features"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        flags = output.lower().replace("avx1.0", "avx").split()
        return frozenset(flags) if flags else None
    return None


def parse_system_info(text: str) -> dict[str, str]:
    """``"CPU : AVX2 = 1 | REPACK = 1 |"`` -> ``{"AVX2": "1", "REPACK": "1"}``."""
    return {key: value.strip() for key, value in re.findall(r"([A-Za-z0-9_]+) = ([^|]*)", text)}


def feature_uses(
    flags: frozenset[str] | None, system_info: str | None, *, x86: bool | None = None
) -> tuple[FeatureUse, ...]:
    """AVX2, AVX-512 and AMX on this CPU and in the build, each with a note when it matters."""
    x86 = _is_x86() if x86 is None else x86
    built = parse_system_info(system_info) if system_info else None
    uses = []
    for name, cpu_names, build_key in FEATURES:
        cpu = None if flags is None or not x86 else all(flag in flags for flag in cpu_names)
        build = None if built is None else built.get(build_key) == "1"
        note = ""
        if build and cpu is False:
            note = (
                "the build uses it but this CPU lacks it: expect SIGILL (a wheel built on "
                "another CPU); delete ~/.cache/draftpen/wheels and reinstall"
            )
        elif name == "AMX" and cpu and build is False:
            note = AMX_LEFT_OUT
        elif name == "AMX" and build:
            note = AMX_BUILT_IN
        elif not x86:
            note = "not an x86-64 CPU: does not apply"
        uses.append(FeatureUse(name=name, cpu=cpu, build=build, note=note))
    return tuple(uses)
