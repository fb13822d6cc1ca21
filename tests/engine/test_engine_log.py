"""engine.log does not grow forever: rotated by the front end that starts an engine, and by
the engine while it runs (its stdout and stderr, C writes included, move to a fresh file).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.client import engine_log_path, ensure_engine
from app.client.engine_log import LOG_MAX_BYTES, backup_path, rotate_log
from app.engine.log_file import RotatingOutput
from app.settings import Settings
from tests.support.engine_fixtures import wait_until
from tests.support.engine_process import short_socket, stop_engine


def test_a_log_past_the_limit_moves_to_dot_1_and_the_older_one_goes(tmp_path: Path):
    log = tmp_path / "engine.log"
    assert not rotate_log(log, 100)  # no log yet: nothing to do
    log.write_bytes(b"a" * 100)
    assert not rotate_log(log, 100) and log.read_bytes() == b"a" * 100  # at the limit: stays
    log.write_bytes(b"b" * 101)
    assert rotate_log(log, 100)
    assert not log.exists() and backup_path(log, 1).read_bytes() == b"b" * 101
    log.write_bytes(b"c" * 101)
    assert rotate_log(log, 100)
    assert backup_path(log, 1).read_bytes() == b"c" * 101  # the older backup is dropped
    assert not backup_path(log, 2).exists()
    log.write_bytes(b"d" * 101)
    assert rotate_log(log, 100, backups=2)
    assert backup_path(log, 2).read_bytes() == b"c" * 101  # with two kept, it shifts


@pytest.fixture
def descriptors() -> Iterator[tuple[int, int]]:
    """Two spare descriptors standing in for the engine's stdout and stderr."""
    fds = (os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY))
    yield fds
    for fd in fds:
        os.close(fd)


def test_the_engines_output_moves_to_a_fresh_file_once_it_passes_the_limit(
    tmp_path: Path, descriptors: tuple[int, int]
):
    log = tmp_path / "cache" / "engine.log"
    output = RotatingOutput(log, fds=descriptors, max_bytes=1000, check_seconds=0.05)
    output.open()
    out, err = descriptors
    os.write(out, b"listening\n")
    os.write(err, b"e" * 600)
    assert log.read_bytes() == b"listening\n" + b"e" * 600  # both descriptors, one file
    assert not output.check()  # under the limit

    output.start_watching()
    try:
        os.write(err, b"f" * 600)  # past the limit: the watcher rotates it
        wait_until(lambda: output.rotations == 1, "the log to be rotated")
        os.write(out, b"after\n")
        os.write(err, b"more\n")
    finally:
        output.stop()
    assert backup_path(log, 1).read_bytes() == b"listening\n" + b"e" * 600 + b"f" * 600
    assert log.read_bytes() == b"after\nmore\n"


def test_an_engine_started_over_a_large_log_rotates_it_first(tmp_path: Path):
    log = engine_log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    old = b"an old engine's line\n" * (LOG_MAX_BYTES // 20)
    log.write_bytes(old)
    assert log.stat().st_size > LOG_MAX_BYTES
    client = ensure_engine(Settings(), socket_path=short_socket("log-rotate"))
    try:
        wait_until(lambda: "listening on unix:" in log.read_text(), "the engine's first line")
        assert backup_path(log, 1).read_bytes() == old
        text = log.read_text()
        assert "--log-file" in text and "an old engine's line" not in text
        assert log.stat().st_size < 100_000
    finally:
        stop_engine(client)
