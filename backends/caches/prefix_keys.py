"""Names for saved prompt prefixes: what a state belongs to, and a chain of block hashes.

A prefix saved to disk may be loaded only by a model that would have computed the same
state itself: the same weights, the same runtime build, the same cache types and
kernels. :func:`identity_key` turns a model's own description of those
(``state_identity``) into one short string.

Prompts are cut into blocks of :data:`BLOCK_TOKENS` tokens, and block ``i`` is named by
a hash of block ``i``'s tokens and the name of block ``i - 1`` (the first block's
"previous" name is the identity key). So a block's name stands for the whole prefix up
to its end, and for that model only: two prompts share a block name exactly when they
share every token up to there (as vLLM's prefix caching keys its blocks).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

# A block is as long as llama.cpp's default batch, so a prompt read from a block
# boundary is split into batches exactly where reading it from the start splits it
# (under exact kernels, batch boundaries are part of what makes two reads equal).
BLOCK_TOKENS = 512
# How much of a model file's beginning and end its identity hashes (its header, its
# tensor index, and the last tensor's data): enough to tell two files apart cheaply.
FILE_SAMPLE_BYTES = 1 << 20


def file_identity(path: str | Path) -> str:
    """A short fingerprint of a model file: its size and hashes of its two ends.

    A full sha256 of a multi-gigabyte file would cost seconds each time an engine
    starts; the ends hold the header (architecture, shapes, quantisation) and data, and
    the size changes with nearly any other edit. Directories (MLX models) are
    fingerprinted file by file.
    """
    path = Path(path)
    digest = hashlib.blake2b(digest_size=16)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}:".encode())
        with file.open("rb") as handle:
            digest.update(handle.read(FILE_SAMPLE_BYTES))
            if size > 2 * FILE_SAMPLE_BYTES:
                handle.seek(size - FILE_SAMPLE_BYTES)
                digest.update(handle.read(FILE_SAMPLE_BYTES))
    return digest.hexdigest()


def identity_key(identity: Mapping[str, object]) -> str:
    """One string for everything that must match before a saved state may be loaded."""
    canonical = json.dumps(dict(identity), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def block_names(key: str, tokens: Sequence[int], *, limit: int | None = None) -> list[str]:
    """The names of ``tokens``' whole blocks, in order (the last partial block has none).

    ``limit`` stops after that many tokens (rounded down to a block).
    """
    count = len(tokens) if limit is None else min(limit, len(tokens))
    blocks = count // BLOCK_TOKENS
    if blocks == 0:
        return []
    array = np.asarray(tokens[: blocks * BLOCK_TOKENS], dtype="<i4")
    names: list[str] = []
    previous = key.encode()
    for index in range(blocks):
        digest = hashlib.blake2b(previous, digest_size=16)
        digest.update(array[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS].tobytes())
        name = digest.hexdigest()
        names.append(name)
        previous = name.encode()
    return names


def block_end(index: int) -> int:
    """How many tokens the prefix named by block ``index`` (from 0) covers."""
    return (index + 1) * BLOCK_TOKENS
