"""Real ``draftpen worker`` processes on 127.0.0.1 (one thread each), started and stopped
for sure, and the fixtures that give a test two of them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backends.workers.endpoints import Endpoint
from backends.workers.wire import WorkerUnreachableError, probe
from tests.runtimes.worker_helpers import as_at_a_terminal
from tests.support.draftpen_cli import REPO

WORKER_COMMAND = (sys.executable, "-m", "app.main", "worker")


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return int(probe_socket.getsockname()[1])


@dataclass
class Worker:
    """A ``draftpen worker`` process and its address."""

    process: subprocess.Popen[str]
    endpoint: Endpoint
    log: Path

    @property
    def address(self) -> str:
        return str(self.endpoint)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_worker(home: Path, *options: str) -> Worker:
    """``draftpen worker --port P --threads 1``, waited for until it answers."""
    port = free_port()
    log = home / f"worker-{port}.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [*WORKER_COMMAND, "--port", str(port), "--threads", "1", *options],
            cwd=REPO,
            env={**os.environ, "DRAFTPEN_HOME": str(home)},
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=as_at_a_terminal,
        )
    endpoint = Endpoint("127.0.0.1", port)
    deadline = time.monotonic() + 60
    while True:
        try:
            probe(endpoint, timeout=2)
            return Worker(process, endpoint, log)
        except WorkerUnreachableError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"draftpen worker did not start:\n{log.read_text()}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DRAFTPEN_HOME for the module (forward costs measured once)."""
    return tmp_path_factory.mktemp("workers-home")


@pytest.fixture
def two_workers(home: Path) -> Iterator[tuple[Worker, Worker]]:
    first, second = start_worker(home), start_worker(home)
    yield first, second
    first.stop()
    second.stop()
