"""Where a model's weights go: this machine alone, or split with its workers.

A model loaded while workers are registered names its devices (see ggml_devices): the
target the workers' devices and this machine's GPUs, with ``n_gpu_layers`` and
``tensor_split`` from :func:`backends.workers.split.split_layers`; any other model this
machine's GPUs alone (none: the CPU), so the draft never waits on the network.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from backends.errors import ModelLoadError
from backends.llamacpp import ggml_devices
from backends.llamacpp.library import last_llama_error, llama_cpp, recent_errors
from backends.workers.endpoints import Endpoint
from backends.workers.split import split_layers
from backends.workers.wire import WorkerInfo


@dataclass
class Placement:
    """``n_gpu_layers``, the devices and their shares for one load (kept alive with it)."""

    gpu_layers: int
    devices: Any = None  # a NULL-terminated ctypes array, or None: llama.cpp's default
    tensor_split: Any = None  # ctypes floats, one per device, or None: by free memory
    where: str = "this machine"
    workers: tuple[Endpoint, ...] = field(default_factory=tuple)

    def apply(self, params: Any) -> None:
        """Set these on ``llama_model_params``."""
        params.n_gpu_layers = self.gpu_layers
        if self.devices is not None:
            params.devices = ctypes.cast(self.devices, ctypes.c_void_p)
        if self.tensor_split is not None:
            params.tensor_split = self.tensor_split


def local_placement(gpu_layers: int) -> Placement:
    """This machine alone: llama.cpp's default, or its own GPUs named once workers are
    registered (which llama.cpp would otherwise use for every model)."""
    if not ggml_devices.workers_registered():
        return Placement(gpu_layers)
    return Placement(gpu_layers, ggml_devices.device_array(ggml_devices.local_accelerators()))


def placement_for(
    path: Path,
    gpu_layers: int,
    workers: Sequence[WorkerInfo],
    weights: Sequence[float] | None,
) -> Placement:
    """Split over ``workers`` and this machine where there are workers, else here alone."""
    return spread_placement(path, workers, weights) if workers else local_placement(gpu_layers)


def layer_count(path: Path) -> int:
    """The model's layer count, from its header alone (a vocabulary-only load)."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        raise ModelLoadError(f"llama.cpp could not read {path} ({last_llama_error()}).")
    try:
        # A vocabulary-only load reads the header's keys but not the hyperparameters.
        architecture = _metadata(model, b"general.architecture")
        count = _metadata(model, architecture.encode("utf-8") + b".block_count")
        if not count.isdigit():
            raise ModelLoadError(f"{path} does not say how many layers it has (block_count).")
        return int(count)
    finally:
        llama_cpp.llama_model_free(model)


def _metadata(model: Any, key: bytes) -> str:
    buffer = ctypes.create_string_buffer(256)
    if llama_cpp.llama_model_meta_val_str(model, key, buffer, len(buffer)) < 0:
        return ""
    return buffer.value.decode("utf-8", "replace")


def spread_placement(
    path: Path, workers: Sequence[WorkerInfo], weights: Sequence[float] | None
) -> Placement:
    """The target split over this machine and ``workers`` (registered here first)."""
    for worker in workers:
        ggml_devices.add_worker(worker.endpoint)
    local = ggml_devices.local_accelerators()
    split = split_layers(
        layer_count(path),
        local_free=psutil.virtual_memory().available,
        worker_free=[worker.free_bytes for worker in workers],
        local_accelerator_free=[device.free for device in local],
        weights=weights,
    )
    chosen = ggml_devices.worker_devices([worker.endpoint for worker in workers]) + local
    # A worker with several devices shares its weight among them by their free memory.
    shares: list[float] = []
    for worker, share in zip(workers, split.device_shares, strict=False):
        free = [device.free for device in worker.devices] or [1]
        shares.extend(share * part / (sum(free) or 1) for part in free)
    shares.extend(split.device_shares[len(workers) :])
    tensor_split = (ctypes.c_float * max(len(shares), 1))(*shares)
    names = [str(worker.endpoint) for worker in workers]
    return Placement(
        gpu_layers=split.offloaded_layers if not local else 999,
        devices=ggml_devices.device_array(chosen),
        tensor_split=tensor_split,
        where=split.describe(names, [device.name for device in local]),
        workers=tuple(worker.endpoint for worker in workers),
    )


def load_weights(path: Path, placement: Placement, params: Any) -> Any:
    """Load the weights where ``params`` (set from ``placement``) say; the workers they
    went to are held (``ggml_devices.hold_workers``: the engine watches them) until the
    model is freed."""
    recent_errors.clear()
    model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        raise ModelLoadError(load_failure(path, placement.workers))
    ggml_devices.hold_workers(placement.workers)
    return model


def load_failure(path: Path, workers: Sequence[Endpoint]) -> str:
    """What a failed load says: the file's fault alone, or perhaps a worker's share."""
    error = last_llama_error()
    if workers:
        return (
            f"llama.cpp could not load {path} split over this machine and "
            f"{', '.join(map(str, workers))} ({error}). A worker may lack the memory for its share "
            "(set the shares with --worker-split), or the file may be damaged: try it "
            "without --workers."
        )
    return (
        f"llama.cpp could not load {path} ({error}). The file may be truncated or corrupt: "
        "delete it and download it again."
    )
