"""A saved prompt prefix's file: its layout, written and read back checked.

Each saved state is one file, ``<id>.prefix``::

    MAGIC, header length (u32), header (JSON: key, label, tokens)
    the state's tokens (int32, little-endian)
    the runtime's state, as its ``write_state`` wrote it
    the state's length (u64), crc32 of tokens and state (u32), MAGIC

Where the files live, their index and their budget are backends/caches/prefix_store.py's.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import BinaryIO, TypeVar

import numpy as np

MAGIC = b"DPPREFX1"
TRAILER = "<QI8s"
TRAILER_BYTES = struct.calcsize(TRAILER)

Decoded = TypeVar("Decoded")


class CorruptPrefixError(Exception):
    """A saved prefix's file does not read back as it was written."""


class _ChecksumFile:
    """A file whose bytes written or read pass through a crc32."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.crc = 0
        self.count = 0

    def write(self, data: bytes | bytearray | memoryview | np.ndarray) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.count += len(view)
        return self.handle.write(view)

    def readinto(self, buffer: bytearray | memoryview | np.ndarray) -> int:
        view = memoryview(buffer).cast("B")
        read = self.handle.readinto(view) or 0
        self.crc = zlib.crc32(view[:read], self.crc)
        self.count += read
        return read

    def read(self, size: int) -> bytes:
        data = self.handle.read(size)
        self.crc = zlib.crc32(data, self.crc)
        self.count += len(data)
        return data


def read_prefix(
    raw: BinaryIO, size: int, key: str, decode: Callable[[tuple[int, ...], BinaryIO, int], Decoded]
) -> tuple[tuple[int, ...], Decoded]:
    """A saved state's tokens and what ``decode(tokens, file, nbytes)`` made of its
    bytes, read from the start of its file (``size`` bytes in all) and checked whole.
    Raises :class:`CorruptPrefixError` when it does not read back as written (or was
    saved under another ``key``)."""
    header = _read_header(raw)
    if header.get("key") != key:
        raise CorruptPrefixError("it was saved for another model or build")
    count = int(header["tokens"])
    nbytes = size - raw.tell() - 4 * count - TRAILER_BYTES
    if nbytes < 0:
        raise CorruptPrefixError("it is truncated")
    checked = _ChecksumFile(raw)
    token_bytes = checked.read(4 * count)
    tokens = tuple(int(t) for t in np.frombuffer(token_bytes, dtype="<i4"))
    decoded = decode(tokens, checked, nbytes)  # type: ignore[arg-type]
    if checked.count != 4 * count + nbytes:
        raise CorruptPrefixError("its state did not read back whole")
    length, crc, magic = struct.unpack(TRAILER, raw.read(TRAILER_BYTES))
    if magic != MAGIC or length != nbytes:
        raise CorruptPrefixError("it is truncated")
    if crc != checked.crc:
        raise CorruptPrefixError("its checksum does not match")
    return tokens, decoded


def write_prefix(
    raw: BinaryIO,
    key: str,
    label: str,
    tokens: Sequence[int],
    encode: Callable[[BinaryIO], None],
) -> None:
    """Write one saved state to a new, empty file: its header, its tokens, what
    ``encode(file)`` writes, and the trailer that checks them."""
    header = json.dumps({"key": key, "label": label, "tokens": len(tokens)}).encode()
    raw.write(MAGIC + struct.pack("<I", len(header)) + header)
    checked = _ChecksumFile(raw)
    checked.write(np.asarray(tokens, dtype="<i4"))
    encode(checked)  # type: ignore[arg-type]
    raw.write(struct.pack(TRAILER, checked.count - 4 * len(tokens), checked.crc, MAGIC))


def _read_header(raw: BinaryIO) -> dict[str, object]:
    start = raw.read(len(MAGIC) + 4)
    if len(start) != len(MAGIC) + 4 or start[: len(MAGIC)] != MAGIC:
        raise CorruptPrefixError("it is not a draftpen prefix file")
    (length,) = struct.unpack("<I", start[len(MAGIC) :])
    if length > 1 << 16:
        raise CorruptPrefixError("its header is damaged")
    header = json.loads(raw.read(length))
    if not isinstance(header, dict):
        raise CorruptPrefixError("its header is damaged")
    return header
