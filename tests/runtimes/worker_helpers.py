"""What the worker tests share: a connection to nobody, and running the worker command as
at a terminal.
"""

from __future__ import annotations

import signal

from backends.workers.endpoints import (
    Endpoint,
)
from backends.workers.hang import Connection


def as_at_a_terminal() -> None:
    """In the child before it runs: Ctrl-C's default action, as a command typed at a
    terminal has it (a suite started as a background job has SIGINT ignored, and its
    children would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def connection(port: int, **facts: object) -> Connection:
    return Connection(Endpoint("10.0.0.2", port), port, **facts)  # type: ignore[arg-type]
