"""Will a pair fit this machine? Weights plus KV caches against RAM, and VRAM on a GPU.

An estimate, stated as one: both models' weights (their sizes on disk), both KV caches
at the context length (f16 keys and values, from the catalog's ``kv_bytes_per_token``
or, where the catalog does not say, a rough share of the model size), and a fixed
allowance for the runtime's buffers. The models screen and ``draftpen models list``
show the same verdict.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import psutil

from app.models.catalog import ModelEntry
from app.models.disk import format_bytes
from app.settings import Settings

DEFAULT_CONTEXT = Settings().context_length
RUNTIME_OVERHEAD_BYTES = 300_000_000
"""Compute buffers, scratch and the runtime itself, per pair: an allowance, not measured."""
DEFAULT_PARALLEL = 4
"""Sequences a serving engine decodes at once by default, where memory allows (as
llama-server's four slots): agents send a few requests at a time."""
KV_SHARE_OF_SIZE_PER_TOKEN = 1 / 40_000
"""Without catalog figures: KV bytes per token ~ size / 40,000 (7-8B Q4: ~60-130 kB)."""
USABLE_RAM_SHARE = 0.8
"""The OS and other programs keep some RAM; a model that needs it all swaps."""
USABLE_VRAM_SHARE = 0.9
APPLE_GPU_SHARE = 0.75
"""Metal lets the GPU wire about three quarters of unified memory by default."""

USABLE_WORKER_SHARE = 0.9
"""Of the free memory a worker reports, what a share of a target may take."""

FitPlace = Literal["gpu", "ram", "workers", "none"]


@dataclass(frozen=True)
class MachineMemory:
    """What this machine can hold: RAM, and GPU memory where there is a GPU."""

    ram_bytes: int
    gpu_name: str | None = None
    vram_bytes: int | None = None
    unified: bool = False
    """Apple Silicon: the GPU shares RAM, so VRAM is a share of ``ram_bytes``."""
    cpu_cores: int | None = None
    """Physical cores, for the CPU speed estimate of a recommendation (None: unknown)."""
    worker_free_bytes: tuple[int, ...] = ()
    """Free memory of each reachable ``draftpen worker`` (the workers setting)."""


@dataclass(frozen=True)
class FitVerdict:
    """Where a pair would run, and the numbers behind it."""

    place: FitPlace
    needed_bytes: int
    ram_bytes: int
    vram_bytes: int | None
    n_ctx: int
    workers: int = 0  # place "workers": how many share the target
    capacity_bytes: int = 0  # place "workers": this machine's and the workers' memory

    @property
    def fits(self) -> bool:
        """Whether the pair fits anywhere on this machine."""
        return self.place != "none"

    @property
    def summary(self) -> str:
        """A few words for a table cell, e.g. ``fits GPU (5.6 GB of 24 GB)``."""
        needed = format_bytes(self.needed_bytes)
        if self.place == "gpu" and self.vram_bytes is not None:
            return f"fits GPU ({needed} of {format_bytes(self.vram_bytes)})"
        if self.place == "ram":
            where = "RAM, CPU only" if self.vram_bytes else "RAM"
            return f"fits {where} ({needed} of {format_bytes(self.ram_bytes)})"
        if self.place == "workers":
            count = f"{self.workers} worker" + ("s" if self.workers != 1 else "")
            return f"fits with {count} ({needed} of {format_bytes(self.capacity_bytes)})"
        return f"too big ({needed}; RAM {format_bytes(self.ram_bytes)})"


def machine_memory() -> MachineMemory:
    """This machine's RAM, and its GPU memory (NVIDIA through nvidia-smi, Apple Silicon)."""
    ram = int(psutil.virtual_memory().total)
    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or None
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return MachineMemory(
            ram,
            gpu_name="Apple Silicon",
            vram_bytes=int(ram * APPLE_GPU_SHARE),
            unified=True,
            cpu_cores=cores,
        )
    name, vram = _nvidia_gpu()
    return MachineMemory(ram, gpu_name=name, vram_bytes=vram, cpu_cores=cores)


def _nvidia_gpu() -> tuple[str | None, int | None]:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None, None
    try:
        result = subprocess.run(
            [tool, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        name, mebibytes = result.stdout.splitlines()[0].rsplit(",", 1)
        return name.strip(), int(float(mebibytes)) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None, None  # a GPU we cannot read is treated as none


def kv_cache_bytes(model: ModelEntry, n_ctx: int) -> int:
    """The model's KV cache at ``n_ctx`` tokens (catalog figure, else an estimate)."""
    per_token = model.kv_bytes_per_token or int(model.size_bytes * KV_SHARE_OF_SIZE_PER_TOKEN)
    return per_token * n_ctx


def pair_memory_bytes(models: Sequence[ModelEntry], n_ctx: int = DEFAULT_CONTEXT) -> int:
    """Memory the models need loaded together: weights, KV caches, runtime buffers."""
    weights = sum(model.size_bytes for model in models)
    caches = sum(kv_cache_bytes(model, n_ctx) for model in models)
    return weights + caches + RUNTIME_OVERHEAD_BYTES


def parallel_that_fits(
    models: Sequence[ModelEntry],
    machine: MachineMemory | None = None,
    n_ctx: int = DEFAULT_CONTEXT,
    most: int = DEFAULT_PARALLEL,
) -> int:
    """How many sequences of ``n_ctx`` tokens each (``serve --parallel auto``) the pair
    holds where it fits alone: up to ``most``, down to 2, else 1. Each sequence takes
    a whole context of KV cache; weights are shared."""
    machine = machine or machine_memory()
    alone = pair_fit(models, machine, n_ctx).place
    if alone == "none":
        return 1
    for count in range(most, 1, -1):
        if pair_fit(models, machine, n_ctx * count).place == alone:
            return count
    return 1


def pair_fit(
    models: Sequence[ModelEntry],
    machine: MachineMemory | None = None,
    n_ctx: int = DEFAULT_CONTEXT,
) -> FitVerdict:
    """Whether ``models`` (a pair variant's target and draft) fit, and where.

    GPU first (all layers offloaded), then RAM (CPU inference, or partial offload).
    """
    machine = machine or machine_memory()
    needed = pair_memory_bytes(models, n_ctx)
    place: FitPlace = "none"
    if machine.vram_bytes is not None:
        share = 1.0 if machine.unified else USABLE_VRAM_SHARE
        if needed <= machine.vram_bytes * share:
            place = "gpu"
    if place == "none" and not machine.unified and needed <= machine.ram_bytes * USABLE_RAM_SHARE:
        place = "ram"
    if place == "none" and machine.worker_free_bytes:
        return _fit_with_workers(models, machine, n_ctx, needed)
    return FitVerdict(place, needed, machine.ram_bytes, machine.vram_bytes, n_ctx)


def _local_capacity(machine: MachineMemory) -> int:
    if machine.vram_bytes is not None:
        share = 1.0 if machine.unified else USABLE_VRAM_SHARE
        return int(machine.vram_bytes * share)
    return int(machine.ram_bytes * USABLE_RAM_SHARE)


def _fit_with_workers(
    models: Sequence[ModelEntry], machine: MachineMemory, n_ctx: int, needed: int
) -> FitVerdict:
    """The target's layers (and their KV) split over this machine and the workers; the
    draft, which never leaves this machine, must fit here beside this machine's share."""
    local = _local_capacity(machine)
    draft = pair_memory_bytes(models[1:], n_ctx) if len(models) > 1 else 0
    workers = sum(int(free * USABLE_WORKER_SHARE) for free in machine.worker_free_bytes)
    capacity = local + workers
    place: FitPlace = "workers" if needed <= capacity and draft <= local else "none"
    return FitVerdict(
        place,
        needed,
        machine.ram_bytes,
        machine.vram_bytes,
        n_ctx,
        workers=len(machine.worker_free_bytes),
        capacity_bytes=capacity,
    )
