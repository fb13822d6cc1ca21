"""How a target's layers are shared between this machine and its workers.

By default each gets a share in proportion to its free memory; ``--worker-split`` sets the
shares instead (this machine first, then each worker in order). On a machine without a
GPU, llama.cpp keeps the layers it does not offload on the CPU, so this machine's share
is the layers left out of ``n_gpu_layers`` (the first ones, and the output layer); the
workers share the rest by ``tensor_split``. With a GPU here, every layer is offloaded and
this machine's share goes to its GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backends.workers.endpoints import WorkerAddressError


@dataclass(frozen=True)
class LayerSplit:
    """Layers kept on this machine's CPU, and the offloaded devices' shares."""

    cpu_layers: int
    offloaded_layers: int
    device_shares: tuple[float, ...]  # one per offloaded device, workers first

    def describe(self, worker_names: Sequence[str], local_names: Sequence[str]) -> str:
        """``12 layers here, 9 on 10.0.0.2:50052, 9 on 10.0.0.3:50052`` (about)."""
        parts = [f"{self.cpu_layers} layers on this CPU"] if self.cpu_layers else []
        total = sum(self.device_shares) or 1.0
        names = [*worker_names, *local_names]
        for name, share in zip(names, self.device_shares, strict=True):
            parts.append(f"~{round(self.offloaded_layers * share / total)} on {name}")
        return ", ".join(parts)


def parse_split(text: str, workers: int) -> tuple[float, ...]:
    """``--worker-split 2,1,1``: this machine's weight, then each worker's."""
    try:
        weights = tuple(float(part) for part in text.split(","))
    except ValueError:
        weights = ()
    if len(weights) != workers + 1 or any(w < 0 for w in weights) or not any(weights):
        raise WorkerAddressError(
            f"--worker-split wants {workers + 1} weights, this machine's first and then each "
            f"worker's in --workers order, such as {','.join(['1'] * (workers + 1))}; not {text!r}."
        )
    return weights


def split_layers(
    n_layers: int,
    *,
    local_free: int,
    worker_free: Sequence[int],
    local_accelerator_free: Sequence[int] = (),
    weights: Sequence[float] | None = None,
) -> LayerSplit:
    """Share ``n_layers`` between this machine and the workers.

    ``local_free`` is this machine's free RAM (its CPU's share where it has no GPU);
    ``local_accelerator_free`` its GPUs' free memory (then the CPU keeps none).
    ``weights``: this machine's weight and each worker's, instead of free memory.
    """
    if weights is not None:
        local_weight, worker_weights = float(weights[0]), [float(w) for w in weights[1:]]
    else:
        local_weight = float(sum(local_accelerator_free) if local_accelerator_free else local_free)
        worker_weights = [float(free) for free in worker_free]
    if local_accelerator_free:
        # Every layer goes to a device: the workers' and this machine's GPUs, which
        # share this machine's weight by their free memory.
        gpu_total = float(sum(local_accelerator_free)) or 1.0
        local_shares = [local_weight * free / gpu_total for free in local_accelerator_free]
        return LayerSplit(0, n_layers, (*worker_weights, *local_shares))
    total = local_weight + sum(worker_weights)
    cpu_layers = round(n_layers * local_weight / total) if total else n_layers
    if sum(worker_weights) == 0:
        cpu_layers = n_layers
    return LayerSplit(cpu_layers, n_layers - cpu_layers, tuple(worker_weights))
