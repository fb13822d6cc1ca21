"""Worker addresses: ``HOST:PORT``, and whether a host is this machine alone."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from backends.errors import BackendError

DEFAULT_WORKER_PORT = 50052
LOOPBACK_NAMES = ("localhost", "ip6-localhost")


class WorkerAddressError(BackendError):
    """A worker address that cannot be used as written."""


@dataclass(frozen=True)
class Endpoint:
    """A worker's address."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """``HOST:PORT``, or ``HOST`` alone for port 50052.

    llama.cpp's RPC client splits an address at its first colon, so a worker is named by
    an IPv4 address or a host name (an IPv6 host can be given a name in /etc/hosts).
    """
    value = text.strip()
    usage = f"A worker is HOST:PORT, such as 192.168.1.20:50052, not {text!r}."
    if value.count(":") > 1 or value.startswith("["):
        raise WorkerAddressError(
            f"{usage} llama.cpp's RPC takes an IPv4 address or a host name, not an IPv6 address."
        )
    host, _, port_text = value.partition(":")
    if not host or (port_text and not port_text.isdigit()) or value.endswith(":"):
        raise WorkerAddressError(usage)
    port = int(port_text) if port_text else DEFAULT_WORKER_PORT
    if not 0 < port < 65536:
        raise WorkerAddressError(f"Worker port {port} in {text!r} is not a port (1-65535).")
    return Endpoint(host, port)


def parse_endpoints(text: str) -> tuple[Endpoint, ...]:
    """A comma-separated list of workers, each once."""
    endpoints = tuple(parse_endpoint(part) for part in text.split(",") if part.strip())
    seen: set[Endpoint] = set()
    for endpoint in endpoints:
        if endpoint in seen:
            raise WorkerAddressError(f"Worker {endpoint} is named twice.")
        seen.add(endpoint)
    return endpoints


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine alone (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
