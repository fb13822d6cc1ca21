"""Tiny GGUF files for tests: a real GGUF header (no tensors) with a chosen vocabulary.

Enough for the header reader, ``models add`` and ``models scan``; nothing loads them.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

_UINT32, _BOOL, _STRING, _ARRAY = 4, 7, 8, 9


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(value: Any) -> tuple[int, bytes]:
    if isinstance(value, bool):
        return _BOOL, struct.pack("<?", value)
    if isinstance(value, int):
        return _UINT32, struct.pack("<I", value)
    if isinstance(value, str):
        return _STRING, _string(value)
    if isinstance(value, list):
        item_type = _STRING if value and isinstance(value[0], str) else _UINT32
        items = b"".join(_value(item)[1] for item in value)
        return _ARRAY, struct.pack("<IQ", item_type, len(value)) + items
    raise TypeError(value)


def write_gguf(
    path: Path,
    *,
    architecture: str = "qwen2",
    tokens: list[str] | None = None,
    bos: int = 1,
    eos: int = 2,
    layers: int = 4,
    kv_heads: int = 2,
    heads: int = 4,
    width: int = 64,
    padding: int = 0,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a header-only GGUF file (version 3) and return its path."""
    metadata: dict[str, Any] = {
        "general.architecture": architecture,
        "general.name": path.stem,
        f"{architecture}.block_count": layers,
        f"{architecture}.attention.head_count": heads,
        f"{architecture}.attention.head_count_kv": kv_heads,
        f"{architecture}.embedding_length": width,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens if tokens is not None else vocabulary(300),
        "tokenizer.ggml.bos_token_id": bos,
        "tokenizer.ggml.eos_token_id": eos,
        **(extra or {}),
    }
    body = b"".join(
        _string(key) + struct.pack("<I", _value(v)[0]) + _value(v)[1] for key, v in metadata.items()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata)) + body + b"\0" * padding)
    return path


def vocabulary(size: int, prefix: str = "tok") -> list[str]:
    """``size`` distinct token texts; two calls with one prefix give the same vocabulary."""
    return [f"{prefix}{index}" for index in range(size)]
