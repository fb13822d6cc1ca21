"""ggml's devices, through its own C API: workers registered as devices, and which
devices a model's weights may go to.

llama-cpp-python 0.3.x binds llama.h only, so this module binds the few ggml-backend
and ggml-rpc functions it needs from the libraries llama-cpp-python installed beside
itself (``llama_cpp/lib``): the same build, so a worker started here speaks exactly the
protocol the main machine's client does.

Once a worker is registered, llama.cpp would spread *every* model it loads over it (its
default device list is every GPU-like device, RPC workers first). draftpen wants only
the target there: so while workers are registered, every load names its devices
(``llama_model_params.devices``), the target's the workers and this machine's
accelerators, every other model's (draft, MTP head) this machine's alone. Drafting
never crosses the network.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.errors import RuntimeUnavailableError
from backends.llamacpp.library import ensure_backend, llama_cpp, note_decoding_thread
from backends.runtime_exchange import is_computing_beside
from backends.workers import watchdog
from backends.workers.endpoints import Endpoint

DEVICE_CPU, DEVICE_GPU, DEVICE_IGPU = 0, 1, 2  # ggml_backend_dev_type
_LIBRARY_DIR = Path(llama_cpp.__file__).parent / "lib"

_lock = threading.Lock()
_registered: dict[Endpoint, list[int]] = {}  # endpoint -> its device pointers
_in_use: dict[Endpoint, int] = {}  # endpoint -> loaded models with layers there
_abort_callback: Any = None  # kept alive while ggml holds it


@dataclass(frozen=True)
class Device:
    """One ggml device: its pointer, name, kind and memory."""

    pointer: int
    name: str
    kind: int
    free: int
    total: int


def _library(name: str) -> ctypes.CDLL:
    # The wheel holds copies, not links (libggml.so, libggml.so.0, libggml.so.0.25.3),
    # and llama.cpp loaded the one its libraries name (libggml.so.0): opening another
    # copy would give a second ggml with registries and an abort hook of its own. So the
    # copy already in this process comes first (Linux's /proc/self/maps), then the
    # versioned name, then any.
    candidates = sorted(_LIBRARY_DIR.glob(f"lib{name}.*"), key=lambda path: -len(path.name))
    loaded = _mapped_paths()
    candidates.sort(key=lambda path: (str(path) not in loaded, ".so.0" not in path.name))
    for candidate in candidates:
        return ctypes.CDLL(str(candidate))
    raise RuntimeUnavailableError(
        f"llama-cpp-python's lib{name} is not in {_LIBRARY_DIR}: this build has no RPC "
        "support. Run packaging/install.sh to rebuild it (it builds with -DGGML_RPC=ON)."
    )


def _mapped_paths() -> set[str]:
    """The files mapped into this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return set()


class _Ggml:
    """The ggml functions this module calls, with their C signatures."""

    def __init__(self) -> None:
        base, ggml = _library("ggml-base"), _library("ggml")
        pointer, size, text = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        self.dev_count = _bind(ggml, "ggml_backend_dev_count", size)
        self.dev_get = _bind(ggml, "ggml_backend_dev_get", pointer, size)
        self.dev_by_type = _bind(ggml, "ggml_backend_dev_by_type", pointer, ctypes.c_int)
        self.register = _bind(ggml, "ggml_backend_register", None, pointer)
        self.dev_name = _bind(base, "ggml_backend_dev_name", text, pointer)
        self.dev_type = _bind(base, "ggml_backend_dev_type", ctypes.c_int, pointer)
        self.dev_memory = _bind(
            base,
            "ggml_backend_dev_memory",
            None,
            pointer,
            ctypes.POINTER(size),
            ctypes.POINTER(size),
        )
        self.set_abort_callback = _bind(
            base, "ggml_set_abort_callback", pointer, ctypes.CFUNCTYPE(None, text)
        )


def _bind(library: ctypes.CDLL, name: str, result: Any, *arguments: Any) -> Callable[..., Any]:
    function = getattr(library, name)
    function.restype = result
    function.argtypes = list(arguments)
    return function


_ggml: _Ggml | None = None


def ggml() -> _Ggml:
    """The bound functions (bound once per process)."""
    global _ggml
    if _ggml is None:
        ensure_backend()
        _ggml = _Ggml()
    return _ggml


def supports_rpc() -> bool:
    """Whether this llama.cpp build has the RPC backend (it can use and be a worker)."""
    return bool(llama_cpp.llama_supports_rpc()) and any(_LIBRARY_DIR.glob("libggml-rpc.*"))


def _rpc() -> ctypes.CDLL:
    if not supports_rpc():
        raise RuntimeUnavailableError(
            "This llama-cpp-python was built without llama.cpp's RPC backend, which workers "
            "need. Run packaging/install.sh again: it builds with -DGGML_RPC=ON (or add "
            "-DGGML_RPC=ON to DRAFTPEN_LLAMA_CMAKE_ARGS)."
        )
    return _library("ggml-rpc")


def devices() -> list[Device]:
    """Every device ggml knows in this process, workers' included (their memory 0)."""
    functions = ggml()
    found = []
    for index in range(int(functions.dev_count())):
        pointer = functions.dev_get(index)
        name = functions.dev_name(pointer).decode("utf-8", "replace")
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        # A worker's memory is a question over the network, and llama.cpp aborts the
        # process if the worker has gone: workers' memory comes from backends.workers.wire.
        if not name.startswith("RPC"):
            functions.dev_memory(pointer, ctypes.byref(free), ctypes.byref(total))
        found.append(
            Device(
                pointer,
                name,
                int(functions.dev_type(pointer)),
                free.value,
                total.value,
            )
        )
    return found


def local_accelerators() -> list[Device]:
    """This machine's GPUs (what llama.cpp offloads to), no worker among them."""
    workers = {pointer for pointers in _registered.values() for pointer in pointers}
    return [
        device
        for device in devices()
        if device.kind in (DEVICE_GPU, DEVICE_IGPU) and device.pointer not in workers
    ]


def supports_gpu_offload() -> bool:
    """Whether this llama.cpp build can put layers on a GPU of this machine (CUDA,
    Metal, ...). Not llama.cpp's own ``llama_supports_gpu_offload``, which is true in
    every build with the RPC backend (workers count as offload there): on a CPU, a
    model would then ask for GPU layers and lose the CPU's exact-kernel settings."""
    return bool(local_accelerators())


def add_worker(endpoint: Endpoint) -> list[Device]:
    """Register the worker at ``endpoint`` (probed first: llama.cpp aborts the process on
    one it cannot reach) as devices of this process; once per endpoint."""
    with _lock:
        if endpoint not in _registered:
            rpc = _rpc()
            add_server = _bind(rpc, "ggml_backend_rpc_add_server", ctypes.c_void_p, ctypes.c_char_p)
            before = {device.pointer for device in devices()}
            registry = add_server(str(endpoint).encode("utf-8"))
            if not registry:
                raise RuntimeUnavailableError(f"llama.cpp could not add worker {endpoint}.")
            ggml().register(registry)
            _registered[endpoint] = [d.pointer for d in devices() if d.pointer not in before]
        pointers = set(_registered[endpoint])
    return [device for device in devices() if device.pointer in pointers]


def hold_workers(endpoints: Sequence[Endpoint]) -> None:
    """A loaded model now has layers on ``endpoints`` (until :func:`release_workers`)."""
    with _lock:
        for endpoint in endpoints:
            _in_use[endpoint] = _in_use.get(endpoint, 0) + 1


def release_workers(endpoints: Sequence[Endpoint]) -> None:
    """A model with layers on ``endpoints`` was freed."""
    with _lock:
        for endpoint in endpoints:
            _in_use[endpoint] = _in_use.get(endpoint, 1) - 1
            if _in_use[endpoint] <= 0:
                del _in_use[endpoint]


def workers_in_use() -> list[Endpoint]:
    """The workers holding layers of a loaded model now."""
    with _lock:
        return list(_in_use)


def decode(context: Any, batch: Any, tokens: int) -> int:
    """``llama_decode``; while a model has layers on workers, timed as one runtime call
    of ``tokens`` for the hung-worker watchdog (``backends/workers/watchdog.py``).

    On a thread computing beside the runtime thread (a split target's verify while the
    draft model drafts, ``backends/speculation/overlap.py``) the graph's local part runs
    on that thread alone: it then leads no second OpenMP team (see ``library.py``).
    """
    if not _in_use:
        note_decoding_thread()
        return int(llama_cpp.llama_decode(context, batch))
    beside = is_computing_beside()
    if beside:
        threads = (llama_cpp.llama_n_threads(context), llama_cpp.llama_n_threads_batch(context))
        llama_cpp.llama_set_n_threads(context, 1, 1)
    else:
        note_decoding_thread()
    try:
        with watchdog.calls.timing(tokens):
            status = int(llama_cpp.llama_decode(context, batch))
            # llama_decode returns once the graph is sent; the wait on the workers comes
            # at the next logits read. Waiting here puts that wait inside the timed call
            # (the caller reads the logits next anyway).
            llama_cpp.llama_synchronize(context)
            return status
    finally:
        if beside:
            llama_cpp.llama_set_n_threads(context, *threads)


def registered_workers() -> list[Endpoint]:
    """The workers registered in this process, in order."""
    return list(_registered)


def workers_registered() -> bool:
    """Whether any worker is registered in this process (loads then name their devices)."""
    return bool(_registered)


def worker_devices(endpoints: Sequence[Endpoint]) -> list[Device]:
    """The registered devices of ``endpoints``, in that order."""
    by_pointer = {device.pointer: device for device in devices()}
    return [by_pointer[p] for endpoint in endpoints for p in _registered.get(endpoint, [])]


def device_array(chosen: Sequence[Device]) -> ctypes.Array[ctypes.c_void_p]:
    """A NULL-terminated array of device pointers for ``llama_model_params.devices``
    (the caller keeps it alive until the load returns)."""
    array = (ctypes.c_void_p * (len(chosen) + 1))()
    for index, device in enumerate(chosen):
        array[index] = device.pointer
    return array


def on_abort(callback: Callable[[str], None]) -> None:
    """Call ``callback`` with ggml's message when it aborts the process (a worker lost
    mid-reply ends in GGML_ABORT), before the process dies."""
    global _abort_callback

    def call(message: bytes | None) -> None:
        callback((message or b"").decode("utf-8", "replace"))

    _abort_callback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)(call)
    ggml().set_abort_callback(_abort_callback)


def serve_as_worker(endpoint: Endpoint, *, threads: int, cache_dir: Path | None) -> None:
    """Serve llama.cpp's RPC protocol at ``endpoint`` until the process ends (blocks in C).

    The devices are this machine's accelerators, else its CPU (as llama.cpp's own
    rpc-server chooses).
    """
    rpc = _rpc()
    chosen = [device for device in devices() if device.kind in (DEVICE_GPU, DEVICE_IGPU)]
    if not chosen:
        chosen = [device for device in devices() if device.kind == DEVICE_CPU][:1]
    start = _bind(
        rpc,
        "ggml_backend_rpc_start_server",
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_void_p,
    )
    cache = str(cache_dir).encode("utf-8") if cache_dir is not None else None
    array = device_array(chosen)
    start(str(endpoint).encode("utf-8"), cache, threads, len(chosen), array)
