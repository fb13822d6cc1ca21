"""A history index's file: the token streams one tokenizer's engines wrote, checked.

One file per tokenizer, ``<key>.history``::

    MAGIC, header length (u32), header (JSON: key, label, tokens)
    the streams' tokens, oldest first, each stream closed by -1 (int32, little-endian)
    the token count (u64), crc32 of the tokens (u32), MAGIC

Where the files live and when they are written is backends/caches/draft_history.py's.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import BinaryIO

import numpy as np

MAGIC = b"DPHIST01"
TRAILER = "<QI8s"
TRAILER_BYTES = struct.calcsize(TRAILER)
MAX_HEADER_BYTES = 1 << 16


class CorruptHistoryError(Exception):
    """A history file does not read back as it was written (or is another tokenizer's)."""


def write_history(raw: BinaryIO, key: str, label: str, tokens: np.ndarray) -> None:
    """Write a history file's whole content to a new, empty file."""
    data = np.ascontiguousarray(tokens, dtype="<i4")
    header = json.dumps({"key": key, "label": label, "tokens": int(data.size)}).encode()
    raw.write(MAGIC + struct.pack("<I", len(header)) + header)
    payload = memoryview(data).cast("B")
    raw.write(payload)
    raw.write(struct.pack(TRAILER, data.size, zlib.crc32(payload), MAGIC))


def read_header(raw: BinaryIO) -> dict[str, object]:
    """A history file's header (key, label, tokens), read from its start."""
    start = raw.read(len(MAGIC) + 4)
    if len(start) != len(MAGIC) + 4 or start[: len(MAGIC)] != MAGIC:
        raise CorruptHistoryError("it is not a draftpen history file")
    (length,) = struct.unpack("<I", start[len(MAGIC) :])
    if length > MAX_HEADER_BYTES:
        raise CorruptHistoryError("its header is damaged")
    try:
        header = json.loads(raw.read(length))
    except ValueError as error:
        raise CorruptHistoryError("its header is damaged") from error
    if not isinstance(header, dict) or not isinstance(header.get("tokens"), int):
        raise CorruptHistoryError("its header is damaged")
    return header


def read_history(raw: BinaryIO, size: int, key: str) -> np.ndarray:
    """The tokens of a history file ``size`` bytes long, checked whole; raises
    :class:`CorruptHistoryError` when it does not read back as written or was written
    for another tokenizer than ``key``'s."""
    header = read_header(raw)
    if header.get("key") != key:
        raise CorruptHistoryError("it was written for another tokenizer")
    count = int(header["tokens"])  # type: ignore[call-overload]
    if count < 0 or size - raw.tell() != 4 * count + TRAILER_BYTES:
        raise CorruptHistoryError("it is truncated")
    payload = raw.read(4 * count)
    trailer = raw.read(TRAILER_BYTES)
    if len(payload) != 4 * count or len(trailer) != TRAILER_BYTES:
        raise CorruptHistoryError("it is truncated")
    stored_count, crc, magic = struct.unpack(TRAILER, trailer)
    if magic != MAGIC or stored_count != count:
        raise CorruptHistoryError("it is truncated")
    if crc != zlib.crc32(payload):
        raise CorruptHistoryError("its checksum does not match")
    return np.frombuffer(payload, dtype="<i4").astype(np.int32)
