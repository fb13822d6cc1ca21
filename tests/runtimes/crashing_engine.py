"""Engines whose runtime crashes on purpose (the test hook in DRAFTPEN_TEST_CRASH), started
as a front end starts them and counted, for the runtime-crash tests.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.client import (
    EngineClient,
    crash_report,
    starting,
)
from tests.support.engine_process import short_socket, stop_engine
from tests.support.model_files import SMOLLM2_KEY, require_model

PAIR = "smollm2"
# Late enough that the reply has reached the client, early enough that it is unfinished.
CRASH_ON_DECODE = "decode:SIGSEGV:12"
LONG_REPLY = 400


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DRAFTPEN_HOME for this module's engines (forward costs measured once)."""
    return tmp_path_factory.mktemp("crash-engine-home")


@pytest.fixture
def engine_home(shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared home, for this test and the engines it starts."""
    monkeypatch.setenv("DRAFTPEN_HOME", str(shared_home))
    return shared_home


@pytest.fixture(autouse=True)
def fresh_front_end() -> Iterator[None]:
    """Each test is a new front-end session: no crash seen yet."""
    crash_report.forget_crashes()
    yield
    crash_report.forget_crashes()


@pytest.fixture
def socket_path(engine_home: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """This test's engine socket; whatever engine still runs there is stopped after."""
    require_model(SMOLLM2_KEY)
    path = short_socket(request.node.name[:36])
    try:
        yield path
    finally:
        stop_engine(EngineClient(path))


@pytest.fixture
def engine_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pid of every engine process a front end starts during the test."""
    pids: list[int] = []
    start = starting._start_engine

    def counted(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        process = start(*args, **kwargs)  # type: ignore[arg-type]
        pids.append(process.pid)
        return process

    monkeypatch.setattr(starting, "_start_engine", counted)
    return pids
