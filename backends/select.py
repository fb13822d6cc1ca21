"""Which runtime runs a model on this machine, and loading a model with it.

Apple Silicon with mlx installed runs MLX (Metal, unified memory); everything else runs
llama.cpp, which offloads to the GPU when its build supports it (CUDA, Metal) and uses
the CPU otherwise. The decision is a pure function of :class:`RuntimeFacts`, so it is
tested without the hardware; :func:`detect_facts` gathers the facts of this machine
without importing either runtime.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.base import Model
from backends.errors import RuntimeUnavailableError
from backends.pair_check import Vocabulary
from backends.workers.wire import WorkerInfo

RUNTIMES = ("llamacpp", "mlx")


@dataclass(frozen=True)
class RankSplit:
    """A target split across the ranks of an mlx distributed group (``draftpen serve``
    under ``mlx.launch``): this process is rank 0, which runs the loop."""

    group: Any  # mx.distributed.Group, from backends.mlx.distributed.join_group()
    how: str = "auto"  # "auto", "pipeline" or "tensor" (backends/mlx/distributed.py)


@dataclass(frozen=True)
class RuntimeFacts:
    """What the runtime choice depends on."""

    system: str  # platform.system(): "Darwin", "Linux", "Windows"
    machine: str  # platform.machine(): "arm64", "x86_64", "aarch64"
    mlx_version: str | None  # None: not installed
    llama_cpp_version: str | None

    @property
    def apple_silicon(self) -> bool:
        """macOS on an Apple chip."""
        return self.system == "Darwin" and self.machine in ("arm64", "aarch64")


@dataclass(frozen=True)
class RuntimeDecision:
    """The runtime to use and, in words, why."""

    runtime: str
    reason: str


def _installed_version(distribution: str, module: str) -> str | None:
    # find_spec looks for the module without importing it (importing mlx or
    # llama_cpp is for their backend modules alone).
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def detect_facts() -> RuntimeFacts:
    """This machine's facts, without importing any runtime."""
    return RuntimeFacts(
        system=platform.system(),
        machine=platform.machine(),
        mlx_version=_installed_version("mlx", "mlx"),
        llama_cpp_version=_installed_version("llama-cpp-python", "llama_cpp"),
    )


def decide_runtime(facts: RuntimeFacts) -> RuntimeDecision:
    """The best runtime for a machine with these facts."""
    if facts.apple_silicon and facts.mlx_version:
        return RuntimeDecision("mlx", f"Apple Silicon with mlx {facts.mlx_version} installed")
    if facts.llama_cpp_version:
        if facts.apple_silicon:
            reason = "Apple Silicon, but mlx is not installed (llama.cpp uses Metal)"
        else:
            reason = f"{facts.system} {facts.machine} is not Apple Silicon"
        return RuntimeDecision("llamacpp", reason)
    if facts.mlx_version:
        return RuntimeDecision("mlx", "llama-cpp-python is not installed; mlx is (CPU)")
    return RuntimeDecision("llamacpp", "no runtime is installed; llama.cpp is the default")


def choose_runtime(requested: str | None = None, facts: RuntimeFacts | None = None) -> str:
    """The runtime to use: the one requested, or the best one for this machine."""
    if requested is None or requested == "auto":
        return decide_runtime(facts or detect_facts()).runtime
    if requested not in RUNTIMES:
        raise RuntimeUnavailableError(
            f"Unknown runtime {requested!r}; choose one of: auto, {', '.join(RUNTIMES)}."
        )
    return requested


def load_vocabulary(path: Path, *, runtime: str) -> Vocabulary | None:
    """A model's tokenizer alone, for the pair check; ``None`` where the runtime has no such load.

    The caller closes it (``close()``) when done.
    """
    if runtime == "llamacpp":
        from backends.llamacpp.vocab import LlamaCppVocabulary

        return LlamaCppVocabulary(path)
    return None


def load_model(
    path: Path,
    *,
    runtime: str,
    n_ctx: int,
    name: str | None = None,
    exact_kernels: bool = False,
    parallel: int = 1,
    workers: Sequence[WorkerInfo] = (),
    worker_split: Sequence[float] | None = None,
    split: RankSplit | None = None,
) -> Model:
    """Load one model (a GGUF file for llama.cpp, an MLX directory for mlx) with ``runtime``.

    ``exact_kernels`` asks llama.cpp for kernels whose small verify batches round like
    one-token decoding (see backends/llamacpp/model.py); MLX has no such choice to make,
    but its sequences beside others then share only forwards that round as alone.
    ``parallel`` N > 1 gives llama.cpp a context of N sequences (``n_ctx`` each), and
    MLX N views of the one loaded model, that generate at once
    (backends/engine_slots.py). ``workers``
    (llama.cpp) split the model's layers over them and this machine (``worker_split``:
    the shares, this machine's first; default: by free memory). ``split`` (mlx) loads
    rank 0's share of a target split across a group's ranks, which mirror its calls.
    """
    if runtime == "llamacpp":
        from backends.llamacpp.model import LlamaCppModel

        return LlamaCppModel(
            path,
            n_ctx=n_ctx,
            name=name,
            exact_kernels=exact_kernels,
            parallel=parallel,
            workers=workers,
            worker_split=worker_split,
        )
    if workers:
        raise RuntimeUnavailableError(
            f"Workers (--workers) split a model with llama.cpp's RPC; the {runtime} runtime "
            "has none. Serve with --runtime llamacpp, or without --workers."
        )
    if split is not None:
        if runtime != "mlx":
            raise RuntimeUnavailableError(
                f"A target split over mlx.launch's ranks needs --runtime mlx, not {runtime}."
            )
        from backends.mlx.distributed import BroadcastTarget, load_share

        share = load_share(path, split.group, split=split.how, n_ctx=n_ctx, parallel=parallel)
        return BroadcastTarget(share)  # type: ignore[return-value]
    if runtime == "mlx":
        from backends.mlx.model import MlxModel

        return MlxModel(path, n_ctx=n_ctx, name=name, parallel=parallel, exact_output=exact_kernels)
    raise RuntimeUnavailableError(f"Runtime {runtime!r} is not available in this build.")
