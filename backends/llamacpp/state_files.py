"""A llama.cpp model's saved sequence state in a file, and what must match to load it.

llama.cpp's per-sequence state (``llama_state_seq_get_data``) is the cells' positions
and their keys and values, laid out by the model's shapes and the cache's types; a
state computed by other weights, another build (its kernels round differently) or
other cache types is not one this model would have computed, so its identity lists
all of them (``backends/caches/prefix_keys.py`` hashes it into the files' key).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from backends.llamacpp.library import llama_cpp, system_info

# A state is read back in slices: one readinto of a multi-gigabyte buffer may return
# short (a pipe, a network file system), and slices make a short read plain to see.
READ_SLICE_BYTES = 64 << 20


def state_identity(
    path: Path,
    *,
    n_batch: int,
    gpu_layers: int,
    exact_kernels: bool,
    bf16_v_cache: bool,
    mtp_layers: int,
) -> Mapping[str, object]:
    """What a saved state of the model at ``path`` depends on, beside its tokens."""
    return {
        "runtime": "llama.cpp",
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
        "system": system_info(),  # the build's features, so its kernels
        "weights": str(path),  # fingerprinted by the cache (prefix_keys.file_identity)
        "n_batch": n_batch,  # where a prompt's batches split
        "gpu_layers": gpu_layers,
        "exact_kernels": exact_kernels,
        "v_cache": "bf16" if bf16_v_cache else "f16",
        "mtp_layers": mtp_layers,
    }


def write_payload(payload: np.ndarray, file: BinaryIO) -> None:
    """Write a saved state's bytes."""
    file.write(memoryview(payload).cast("B"))


def read_payload(file: BinaryIO, nbytes: int) -> np.ndarray:
    """Read ``nbytes`` of a saved state into a fresh buffer; ValueError if they end early."""
    buffer = np.empty(nbytes, dtype=np.uint8)
    view = memoryview(buffer)
    offset = 0
    while offset < nbytes:
        read = file.readinto(view[offset : offset + READ_SLICE_BYTES])
        if not read:
            raise ValueError(f"the state ends after {offset} of {nbytes} bytes")
        offset += read
    return buffer
