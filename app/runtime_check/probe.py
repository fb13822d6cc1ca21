"""The runtime check's child process: load the tiny model, decode, report as it goes.

Run as ``python -m app.runtime_check.probe MODEL.gguf``. It prints one JSON object a
line on stdout, flushed as each stage is reached, so that when llama.cpp kills the
process the parent still knows what was loaded and which stage died:

1. ``imported``: llama-cpp-python's version, llama.cpp's system info, GPU offload, and
   the drafters this build runs (those whose functions the library exports);
2. ``loaded``: the model's facts (the parent already knows the file's);
3. ``decoded_one_at_a_time``: a few tokens, one ``llama_decode`` each;
4. ``decoded_batch``: one batch of tokens in one ``llama_decode``: the batched matmul
   on repacked weights is what crashed on AMX (llama.cpp #20824).

A Python error ends with ``{"stage": "error", ...}`` and exit status 1. The model is
loaded on the CPU (no layers offloaded): the CPU kernels are the ones that differ from
one machine to the next.

Test hook: ``DRAFTPEN_RUNTIME_CHECK_CRASH=SIGSEGV`` (or any signal name: SIGILL,
SIGBUS, SIGABRT, ...) makes this process kill itself with that signal after loading
and decoding one token at a time, right where the AMX crash happens;
``DRAFTPEN_RUNTIME_CHECK_CRASH=hang`` makes it sleep instead. The tests use it to
prove the parent's diagnosis and the installer's fallback without a broken build.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CRASH_HOOK_ENV = "DRAFTPEN_RUNTIME_CHECK_CRASH"
ONE_AT_A_TIME = 4  # single-token decodes before the batch
BATCH = 32  # tokens in the one batched decode: enough rows for the tiled/repacked gemm
CONTEXT = 128


def _emit(stage: str, **facts: Any) -> None:
    print(json.dumps({"stage": stage, **facts}), flush=True)


def _no_core_dumps() -> None:
    """A crash is the expected failure here: report it, do not leave a core file."""
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    except (ImportError, ValueError, OSError):  # no resource module (Windows), or refused
        pass


def _crash_hook() -> None:
    """The test hook (see the module docstring): die or hang on demand."""
    request = os.environ.get(CRASH_HOOK_ENV, "").strip()
    if not request:
        return
    if request.lower() == "hang":
        while True:
            time.sleep(3600)
    name = request.upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        signum = signal.Signals[name]
    except KeyError:
        raise ValueError(f"{CRASH_HOOK_ENV}={request!r} names no signal") from None
    # As a kernel's fault would: faulthandler prints the stack, then the signal's
    # default action ends the process.
    os.kill(os.getpid(), signum)
    time.sleep(10)  # the signal arrives at once; never go on to report success


def _finite_rows(logits: np.ndarray) -> int:
    """How many logits rows are entirely finite (a broken kernel gives NaN or inf)."""
    return int(np.isfinite(logits).all(axis=1).sum())


def run(model_path: Path) -> None:
    """Load ``model_path`` and decode; each stage is printed as it completes."""
    started = time.perf_counter()
    from backends.llamacpp import ggml_devices
    from backends.llamacpp import library as llamacpp_library
    from backends.llamacpp import model as llamacpp
    from backends.llamacpp.drafter_support import drafter_support

    _emit(
        "imported",
        llama_cpp_version=llamacpp_library.llama_cpp.__version__,
        system_info=llamacpp_library.system_info(),
        gpu_offload=ggml_devices.supports_gpu_offload(),
        rpc=ggml_devices.supports_rpc(),
        drafters=drafter_support(),
    )
    model = llamacpp.LlamaCppModel(
        model_path, n_ctx=CONTEXT, n_batch=BATCH, gpu_layers=0, name=model_path.stem
    )
    _emit(
        "loaded",
        n_vocab=model.n_vocab,
        size_bytes=model.size_bytes,
        n_threads=model.n_threads,
    )
    # Any ids past the first few special ones would do.
    tokens = [3 + index % (model.n_vocab - 3) for index in range(ONE_AT_A_TIME + BATCH)]
    finite = 0
    for token in tokens[:ONE_AT_A_TIME]:
        finite += _finite_rows(model.forward([token]))
    _emit("decoded_one_at_a_time", tokens=ONE_AT_A_TIME, finite_rows=finite)
    _crash_hook()
    logits = model.forward(tokens[ONE_AT_A_TIME:])
    _emit(
        "decoded_batch",
        tokens=BATCH,
        finite_rows=_finite_rows(logits),
        seconds=round(time.perf_counter() - started, 3),
    )
    model.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child; exit 0 when every stage ran, 1 on a Python error."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m app.runtime_check.probe MODEL.gguf", file=sys.stderr)
        return 2
    _no_core_dumps()
    # A crash in a kernel prints the Python stack on stderr (the parent keeps its tail);
    # the process still dies by the same signal.
    faulthandler.enable()
    try:
        run(Path(args[0]))
    except Exception as error:  # reported to the parent, which shows it
        _emit("error", error=f"{type(error).__name__}: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
