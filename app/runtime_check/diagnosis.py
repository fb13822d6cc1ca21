"""What a runtime that died by a signal most likely means, and what fixes it.

A process that llama.cpp kills gives no Python error, only a signal. These are the
likely causes on the machines people run draftpen on; each names its fix. Kept apart
from the check so that anything that watches a llama.cpp process die (the installer's
check, ``draftpen doctor``, a front end whose engine crashed) says the same thing.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

PORTABLE_REBUILD = (
    "rebuild llama-cpp-python with the portable flags (no -march=native, no AVX-512 or "
    "AMX): DRAFTPEN_LLAMA_FLAVOUR=portable bash packaging/install.sh (the installer "
    "does this by itself, once, when its runtime check crashes)"
)
NATIVE_REBUILD = (
    "delete the cached wheel (rm -r ~/.cache/draftpen/wheels) and run "
    "bash packaging/install.sh again, which builds for this CPU; or rebuild with the "
    "portable flags: DRAFTPEN_LLAMA_FLAVOUR=portable bash packaging/install.sh"
)


@dataclass(frozen=True)
class SignalDiagnosis:
    """A signal's name, its likely cause here, and the fix to try."""

    signal: str  # "SIGSEGV"
    number: int
    cause: str
    fix: str


def signal_name(number: int) -> str:
    """``11`` -> ``"SIGSEGV"``; an unknown number -> ``"signal 99"``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def explain_signal(number: int) -> SignalDiagnosis:
    """The likely cause of a llama.cpp process dying by signal ``number`` and its fix."""
    name = signal_name(number)
    if name in ("SIGSEGV", "SIGBUS"):
        cause = (
            "the runtime crashed in a CPU kernel: the instruction sets the llama.cpp build "
            "uses (its AMX matmul segfaults on Intel CPUs with AMX: llama.cpp #20824)"
        )
        fix = PORTABLE_REBUILD
    elif name == "SIGILL":
        cause = (
            "an instruction this CPU does not have: llama-cpp-python was built on another "
            "CPU (a copied virtualenv, or a home directory shared with another machine "
            "whose wheel cache it reuses)"
        )
        fix = NATIVE_REBUILD
    elif name == "SIGABRT":
        cause = (
            "a ggml assertion failed (GGML_ASSERT/GGML_ABORT): the runtime refused a "
            "model, a shape or a buffer; the error output above names it"
        )
        fix = (
            "run `draftpen doctor`; if its check passes the model file is the likely "
            f"culprit (download it again); if not, {PORTABLE_REBUILD}"
        )
    elif name == "SIGKILL":
        cause = "killed from outside, most often by the kernel when memory ran out"
        fix = "free memory or choose a smaller model pair (draftpen models)"
    else:
        cause = f"the runtime process was killed by {name}"
        fix = f"run `draftpen doctor`; if its check fails, {PORTABLE_REBUILD}"
    return SignalDiagnosis(signal=name, number=number, cause=cause, fix=fix)


HANG_CAUSE = (
    "the runtime decoded nothing before the time limit: a kernel or its worker threads "
    "hung (or the machine is badly overloaded)"
)
HANG_FIX = f"run `draftpen doctor` again on an idle machine; if it still hangs, {PORTABLE_REBUILD}"
