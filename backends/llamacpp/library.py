"""The llama.cpp library itself, once per process: its guarded import, its one-time
init, the log it writes (warnings and errors kept, so a failed load can say why), what
this build supports, and the check that a file is a GGUF before llama.cpp reads it.

The other modules of this package take ``llama_cpp`` from here, so that a missing
runtime always says how to install it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections import deque
from pathlib import Path

from backends.errors import ModelLoadError, RuntimeUnavailableError

try:
    import llama_cpp
except ImportError as error:  # pragma: no cover - exercised where llama_cpp is absent
    raise RuntimeUnavailableError(
        "llama-cpp-python is not installed. Run packaging/install.sh, or "
        "`pip install llama-cpp-python` in draftpen's environment."
    ) from error


GGUF_MAGIC = b"GGUF"
_GGML_LOG_LEVELS_KEPT = (3, 4)  # ggml.h: GGML_LOG_LEVEL_WARN and GGML_LOG_LEVEL_ERROR
_GGML_LOG_LEVEL_CONT = 5  # continues the previous message

_backend_lock = threading.Lock()
_backend_ready = False
recent_errors: deque[str] = deque(maxlen=20)
_last_level = 0


@llama_cpp.llama_log_callback
def log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp is chatty on stderr; keep warnings and errors so a failed load can
    # say why, and print nothing (the TUI owns the terminal).
    global _last_level
    if level != _GGML_LOG_LEVEL_CONT:
        _last_level = level
    if _last_level in _GGML_LOG_LEVELS_KEPT:
        recent_errors.append(text.decode("utf-8", errors="replace").strip())


def ensure_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_log_set(log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True


# llama.cpp's CPU kernels, in the OpenMP build that install.sh makes on Linux, want one
# thread per process to run them. Each thread that computes a graph becomes the master of
# an OpenMP team of its own; once libgomp manages more threads than the process may use
# CPUs, it waits at barriers with a ~100-spin "throttled" count instead of ~3 ms of
# spinning, so the barrier between every two operations of the graph sleeps in the
# kernel. Measured on 2 cores (issue 34): plain decoding 0.75x, from the second thread
# on, for every thread. The engine runs all of its llama.cpp work on its worker thread;
# these threads are recorded so that a second one is said in the log.
_decoding_threads: set[int] = set()
logger = logging.getLogger("draftpen.llamacpp")


def note_decoding_thread() -> None:
    """Record the thread about to run a graph; warn once when a second one does."""
    thread = threading.get_ident()
    if thread in _decoding_threads:
        return
    _decoding_threads.add(thread)
    if len(_decoding_threads) == 2:
        logger.warning(
            "llama.cpp now computes on a second thread of this process: its OpenMP "
            "threads outnumber the CPUs and wait without spinning, which slows every "
            "forward pass (about 25%% on 2 cores). Keep one thread for llama.cpp."
        )


def decoding_threads() -> int:
    """How many threads of this process have run a llama.cpp graph."""
    return len(_decoding_threads)


def last_llama_error() -> str:
    messages = [m for m in recent_errors if m]
    return messages[-1] if messages else "no details from llama.cpp"


def physical_cores() -> int:
    """Physical CPU cores (llama.cpp's own default is half the logical ones)."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False)
    except ImportError:  # pragma: no cover - psutil is a dependency
        cores = None
    return max(1, cores or os.cpu_count() or 1)


def system_info() -> str:
    """llama.cpp's own list of what this build uses: ``CPU : AVX2 = 1 | AMX_INT8 = 1 | ...``.

    ggml lists the instruction sets it was compiled for, so this is the build's side of
    "does this CPU have it / does the runtime use it" (``draftpen doctor``)."""
    ensure_backend()
    return bytes(llama_cpp.llama_print_system_info()).decode("utf-8", errors="replace").strip()


def check_gguf_file(path: Path) -> None:
    """Fail early, with a useful message, on a missing or non-GGUF file."""
    if not path.is_file():
        raise ModelLoadError(f"Model file not found: {path}")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF model file (it starts with {magic!r}). "
            "Delete it and download the model again."
        )
