"""A short conversation with a worker, without the runtime: its protocol and memory.

llama.cpp's RPC client aborts the whole process when a worker cannot be reached or
speaks another protocol version (``GGML_ABORT`` in ggml-rpc.cpp). So before a worker is
handed to llama.cpp, draftpen asks it itself, over a socket with a timeout: HELLO (the
protocol version), DEVICE_COUNT, and GET_DEVICE_MEMORY for each device. Each request is
``command (1 byte) | size (8 bytes, little-endian) | payload``, each answer ``size |
payload``; the HELLO payload is 24 bytes of transport capabilities, all zero here (plain
TCP: no RDMA upgrade). A worker serves one main machine at a time, so a worker that is
busy with another answers nothing until that one lets go: that is a timeout too.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from backends.errors import BackendError
from backends.workers.endpoints import Endpoint

# The protocol of ggml-rpc.h in the llama.cpp that llama-cpp-python 0.3.36 vendors
# (RPC_PROTO_*_VERSION). tests/runtimes/test_workers_real.py asks a real worker of this build, so
# a new pin whose protocol moved fails there until this is updated.
PROTOCOL = (7, 0, 0)
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CAPS_SIZE = 24
DEFAULT_TIMEOUT = 5.0


class WorkerUnreachableError(BackendError):
    """A worker that does not answer (refused, timed out, closed the connection)."""


class WorkerVersionError(BackendError):
    """A worker that speaks another RPC protocol version than this draftpen."""


@dataclass(frozen=True)
class WorkerDevice:
    """One device a worker computes on, and its memory in bytes."""

    free: int
    total: int


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker said: its protocol version and devices."""

    endpoint: Endpoint
    protocol: tuple[int, int, int]
    devices: tuple[WorkerDevice, ...]

    @property
    def free_bytes(self) -> int:
        """Free memory over all of the worker's devices."""
        return sum(device.free for device in self.devices)


def version_text(version: tuple[int, int, int]) -> str:
    """``7.0.0``."""
    return ".".join(str(part) for part in version)


def compatible(version: tuple[int, int, int], ours: tuple[int, int, int] = PROTOCOL) -> bool:
    """Whether llama.cpp's client accepts a worker of ``version``: the same major version
    and a minor version no newer than ours (its own rule in ggml-rpc.cpp)."""
    return version[0] == ours[0] and version[1] <= ours[1]


def _receive(connection: socket.socket, size: int, endpoint: Endpoint) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = connection.recv(size - len(chunks))
        if not chunk:
            raise EOFError(f"{endpoint} closed the connection")
        chunks.extend(chunk)
    return bytes(chunks)


def _ask(
    connection: socket.socket, endpoint: Endpoint, command: int, payload: bytes, answer_size: int
) -> bytes:
    connection.sendall(struct.pack("<BQ", command, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _receive(connection, 8, endpoint))
    if size != answer_size:
        raise EOFError(f"{endpoint} answered {size} bytes where {answer_size} were expected")
    return _receive(connection, size, endpoint)


def probe(endpoint: Endpoint, *, timeout: float = DEFAULT_TIMEOUT) -> WorkerInfo:
    """Ask the worker at ``endpoint`` its protocol version and devices' memory.

    Raises :class:`WorkerUnreachableError` or :class:`WorkerVersionError`, each saying
    what to do. Every wait is bounded by ``timeout`` seconds.
    """
    try:
        connection = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as error:
        raise WorkerUnreachableError(
            f"Worker {endpoint} cannot be reached ({error.strerror or error}). Start "
            f"`draftpen worker` there (and check the address and port), or leave it out "
            "of --workers (the workers setting)."
        ) from error
    with connection:
        connection.settimeout(timeout)
        try:
            hello = _ask(connection, endpoint, CMD_HELLO, bytes(CAPS_SIZE), 4 + CAPS_SIZE)
        except (OSError, EOFError) as error:
            raise WorkerUnreachableError(
                f"Worker {endpoint} accepted the connection but did not answer draftpen's "
                f"hello ({error}). It may be serving another main machine (a worker serves one "
                "at a time), be something else than `draftpen worker`, or speak an older "
                "protocol: check what runs there."
            ) from error
        version = (hello[0], hello[1], hello[2])
        if not compatible(version):
            raise WorkerVersionError(
                f"Worker {endpoint} speaks llama.cpp RPC protocol {version_text(version)}; this "
                f"draftpen speaks {version_text(PROTOCOL)}. Install the same draftpen (and so "
                "the same llama-cpp-python build) on both machines."
            )
        try:
            (count,) = struct.unpack("<I", _ask(connection, endpoint, CMD_DEVICE_COUNT, b"", 4))
            devices = []
            for index in range(count):
                answer = _ask(
                    connection, endpoint, CMD_GET_DEVICE_MEMORY, struct.pack("<I", index), 16
                )
                free, total = struct.unpack("<QQ", answer)
                devices.append(WorkerDevice(free, total))
        except (OSError, EOFError) as error:
            raise WorkerUnreachableError(
                f"Worker {endpoint} stopped answering while telling its memory ({error}). "
                "Check that `draftpen worker` still runs there."
            ) from error
    return WorkerInfo(endpoint, version, tuple(devices))


def unreachable(endpoint: Endpoint, *, timeout: float = 1.0) -> str | None:
    """Why nothing listens at ``endpoint`` now ("connection refused"), or None if
    something does. No hello: a worker serving this process would not answer one."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout):
            return None
    except TimeoutError:
        return "not reachable (timed out)"
    except OSError as error:
        return (error.strerror or str(error)).lower()
