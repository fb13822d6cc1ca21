"""The workers a main machine uses (``serve --workers``), asked before each load."""

from __future__ import annotations

from dataclasses import dataclass

from backends.workers.endpoints import Endpoint, parse_endpoints
from backends.workers.split import parse_split
from backends.workers.wire import DEFAULT_TIMEOUT, WorkerInfo, probe


@dataclass(frozen=True)
class Workers:
    """Worker addresses, in order, and the layer shares if set (this machine first)."""

    endpoints: tuple[Endpoint, ...]
    weights: tuple[float, ...] | None = None

    @classmethod
    def parse(cls, addresses: str, split: str | None = None) -> Workers:
        """From ``--workers A:P,B:P`` and ``--worker-split 2,1,1``."""
        endpoints = parse_endpoints(addresses)
        weights = parse_split(split, len(endpoints)) if split else None
        return cls(endpoints, weights)

    def ask(self, *, timeout: float = DEFAULT_TIMEOUT) -> tuple[WorkerInfo, ...]:
        """Each worker's protocol and memory, now; the first that fails raises its error
        (naming it and what to do)."""
        return tuple(probe(endpoint, timeout=timeout) for endpoint in self.endpoints)

    def __str__(self) -> str:
        return ", ".join(str(endpoint) for endpoint in self.endpoints)
