"""Workers without a model: addresses, layer shares, the protocol check against servers
written here (another version, a silent one, none), the fit across machines, the worker
command's refusals, keepalive on real sockets, the timeout setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli.worker import check_address
from app.engine.worker_options import worker_timeout_from
from app.errors import DraftpenError, SettingsError
from app.models.catalog import ModelEntry, ModelSources
from app.models.fit import MachineMemory, pair_fit
from app.models.worker_memory import with_workers
from app.settings import Settings
from backends.workers import keepalive
from backends.workers.cluster import Workers
from backends.workers.endpoints import (
    Endpoint,
    WorkerAddressError,
    is_loopback,
    parse_endpoint,
    parse_endpoints,
)
from backends.workers.split import parse_split, split_layers
from backends.workers.wire import (
    PROTOCOL,
    WorkerUnreachableError,
    WorkerVersionError,
    compatible,
    probe,
    unreachable,
)
from tests.runtimes.worker_helpers import (
    as_at_a_terminal,
)
from tests.support.draftpen_cli import REPO

GIB = 1 << 30


# -- addresses --------------------------------------------------------------------------


def test_worker_addresses_parse_with_a_default_port_and_refuse_what_llama_cpp_cannot_take():
    assert parse_endpoints("10.0.0.2:50053, gpu-box") == (
        Endpoint("10.0.0.2", 50053),
        Endpoint("gpu-box", 50052),
    )
    for bad in ("a:b", "host:", ":50052", "host:70000", "::1", "[::1]:50052"):
        with pytest.raises(WorkerAddressError):
            parse_endpoint(bad)
    with pytest.raises(WorkerAddressError, match="named twice"):
        parse_endpoints("a:1,a:1")


def test_loopback_is_this_machine_alone():
    assert is_loopback("127.0.0.1") and is_loopback("127.3.0.9") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.20")
    assert not is_loopback("gpu-box")


# -- layer shares -----------------------------------------------------------------------


def test_a_cpu_main_machine_keeps_its_share_of_layers_and_offloads_the_rest():
    split = split_layers(30, local_free=8 * GIB, worker_free=[8 * GIB, 16 * GIB])
    assert (split.cpu_layers, split.offloaded_layers) == (8, 22)
    assert split.device_shares == (8 * GIB, 16 * GIB)
    assert split.describe(["a:1", "b:2"], []) == "8 layers on this CPU, ~7 on a:1, ~15 on b:2"


def test_set_weights_win_over_free_memory_and_a_zero_weight_holds_nothing():
    split = split_layers(30, local_free=GIB, worker_free=[GIB], weights=(0, 1))
    assert (split.cpu_layers, split.offloaded_layers) == (0, 30)
    assert split_layers(30, local_free=GIB, worker_free=[0]).cpu_layers == 30
    split = split_layers(
        40, local_free=GIB, worker_free=[4 * GIB], local_accelerator_free=[12 * GIB, 4 * GIB]
    )
    # With GPUs here, every layer goes to a device; this machine's weight is its GPUs'.
    assert (split.cpu_layers, split.offloaded_layers) == (0, 40)
    assert split.device_shares == (4 * GIB, 12 * GIB, 4 * GIB)


def test_worker_split_needs_one_weight_per_machine():
    assert parse_split("2,1,1", 2) == (2.0, 1.0, 1.0)
    for bad in ("2,1", "a,b,c", "-1,1,1", "0,0,0"):
        with pytest.raises(WorkerAddressError, match="this machine's first"):
            parse_split(bad, 2)
    assert Workers.parse("a:1,b:2", "1,1,2").weights == (1.0, 1.0, 2.0)


# -- the protocol check, against servers written here ----------------------------------


class FakeWorker:
    """A TCP server that answers HELLO with ``version`` (or not at all) and its memory."""

    def __init__(self, version: tuple[int, int, int] | None, free: list[int]) -> None:
        self.version = version
        self.free = free
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = Endpoint("127.0.0.1", self.server.getsockname()[1])
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _read(self, connection: socket.socket) -> tuple[int, bytes]:
        command, size = struct.unpack("<BQ", connection.recv(9, socket.MSG_WAITALL))
        payload = connection.recv(size, socket.MSG_WAITALL) if size else b""
        return command, payload

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                if self.version is None:  # accepts, and never answers
                    time.sleep(5)
                    continue
                command, payload = self._read(connection)
                assert command == 14 and payload == bytes(24)
                answer = bytes([*self.version, 0]) + bytes(24)
                connection.sendall(struct.pack("<Q", len(answer)) + answer)
                try:
                    command, _ = self._read(connection)
                except struct.error:
                    continue  # the client hung up after the version
                connection.sendall(struct.pack("<QI", 4, len(self.free)))
                for free in self.free:
                    command, payload = self._read(connection)
                    assert command == 11
                    connection.sendall(struct.pack("<QQQ", 16, free, 2 * free))

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def fake_worker(request: pytest.FixtureRequest) -> Iterator[FakeWorker]:
    version, free = request.param
    worker = FakeWorker(version, free)
    yield worker
    worker.close()


@pytest.mark.parametrize("fake_worker", [(PROTOCOL, [3 * GIB, GIB])], indirect=True)
def test_a_worker_of_this_protocol_says_each_devices_memory(fake_worker: FakeWorker):
    info = probe(fake_worker.endpoint, timeout=2)
    assert info.protocol == PROTOCOL and info.free_bytes == 4 * GIB
    assert [device.total for device in info.devices] == [6 * GIB, 2 * GIB]


@pytest.mark.parametrize("fake_worker", [((6, 1, 0), [GIB])], indirect=True)
def test_a_worker_of_another_protocol_is_refused_naming_both_versions(fake_worker: FakeWorker):
    with pytest.raises(WorkerVersionError) as refused:
        probe(fake_worker.endpoint, timeout=2)
    message = str(refused.value)
    assert "6.1.0" in message and "7.0.0" in message and str(fake_worker.endpoint) in message
    assert "same draftpen" in message


def test_versions_follow_llama_cpps_rule():
    assert compatible((7, 0, 9)) and not compatible((7, 1, 0)) and not compatible((8, 0, 0))
    assert compatible((7, 0, 0), ours=(7, 2, 0))


@pytest.mark.parametrize("fake_worker", [(None, [])], indirect=True)
def test_a_worker_that_never_answers_is_an_error_within_the_timeout(fake_worker: FakeWorker):
    started = time.monotonic()
    with pytest.raises(WorkerUnreachableError, match="did not answer draftpen's hello"):
        probe(fake_worker.endpoint, timeout=0.5)
    assert time.monotonic() - started < 3


def test_a_worker_nobody_runs_is_named_with_what_to_do():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = Endpoint("127.0.0.1", closed.getsockname()[1])
    with pytest.raises(WorkerUnreachableError) as refused:
        probe(endpoint, timeout=1)
    assert f"Worker {endpoint} cannot be reached" in str(refused.value)
    assert "draftpen worker" in str(refused.value)
    assert unreachable(endpoint) == "connection refused"


# -- the fit across machines ------------------------------------------------------------


def model(key: str, size: int) -> ModelEntry:
    return ModelEntry(
        key=key,
        name=key,
        format="gguf",
        architecture="llama",
        size_bytes=size,
        sha256=None,
        sources=ModelSources(),
        kv_bytes_per_token=1000,
    )


def test_a_pair_too_big_for_this_machine_fits_with_workers_with_the_draft_kept_here():
    pair = [model("target", 30 * GIB), model("draft", GIB)]
    alone = MachineMemory(ram_bytes=16 * GIB)
    assert pair_fit(pair, alone).place == "none"
    two = dataclasses.replace(alone, worker_free_bytes=(12 * GIB, 12 * GIB))
    verdict = pair_fit(pair, two)
    assert verdict.place == "workers" and verdict.fits
    assert verdict.summary.startswith("fits with 2 workers (")
    one = dataclasses.replace(alone, worker_free_bytes=(12 * GIB,))
    assert pair_fit(pair, one).place == "none"  # 12.8 + 10.8 GiB is not enough
    # The draft never leaves this machine: one too big for it does not fit anywhere.
    huge_draft = [model("target", 30 * GIB), model("draft", 14 * GIB)]
    assert pair_fit(huge_draft, two).place == "none"


@pytest.mark.parametrize("fake_worker", [(PROTOCOL, [10 * GIB])], indirect=True)
def test_models_list_counts_the_workers_that_answer(fake_worker: FakeWorker):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        gone = Endpoint("127.0.0.1", closed.getsockname()[1])
    settings = Settings(workers=f"{fake_worker.endpoint},{gone}")
    machine, lines = with_workers(MachineMemory(ram_bytes=16 * GIB), settings)
    assert machine.worker_free_bytes == (10 * GIB,)
    assert lines[0] == f"worker {fake_worker.endpoint}: 10.0 GiB free"
    assert lines[1].startswith(f"worker {gone}: not counted (Worker {gone} cannot be reached")


def test_the_workers_setting_is_checked_like_the_others():
    with pytest.raises(SettingsError, match="workers: A worker is HOST:PORT"):
        Settings(workers="a:b")
    with pytest.raises(SettingsError, match="worker_split needs workers"):
        Settings(worker_split="1,1")
    with pytest.raises(SettingsError, match="wants 2 weights"):
        Settings(workers="a:1", worker_split="1,1,1")
    assert Settings(workers="a:1", worker_split="2,1").workers == "a:1"


# -- the worker command -----------------------------------------------------------------


def test_a_worker_listens_beyond_this_machine_only_when_told_why_not():
    assert check_address("127.0.0.1", 50052, allow_network=False) == Endpoint("127.0.0.1", 50052)
    with pytest.raises(DraftpenError) as refused:
        check_address("0.0.0.0", 50052, allow_network=False)
    message = str(refused.value)
    assert "no authentication" in message and "ssh -N -L" in message
    assert "--allow-network" in message
    assert check_address("0.0.0.0", 50052, allow_network=True).host == "0.0.0.0"


def test_the_worker_command_refuses_a_network_address_and_runs_with_the_flag(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-m", "app.main", "worker", "--threads", "1"]
    env = {"DRAFTPEN_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    refused = subprocess.run(
        [*command, "--host", "0.0.0.0"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 1 and "Refusing to listen on 0.0.0.0" in refused.stderr
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    worker = subprocess.Popen(
        [*command, "--host", "0.0.0.0", "--port", str(port), "--allow-network"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_at_a_terminal,
    )
    try:
        deadline = time.monotonic() + 30
        while probe_or_none(Endpoint("127.0.0.1", port)) is None:
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        worker.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = worker.communicate(timeout=10)
    finally:
        worker.kill()
    assert worker.returncode == 0
    assert "warning: listening on 0.0.0.0" in err and "no authentication" in err
    assert f"draftpen serve --workers THIS-MACHINE'S-ADDRESS:{port}" in out
    assert "draftpen worker stopped." in out


def probe_or_none(endpoint: Endpoint) -> object | None:
    try:
        return probe(endpoint, timeout=1)
    except WorkerUnreachableError:
        return None


def test_a_busy_port_is_said_before_llama_cpp_tries_it(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "app.main", "worker", "--port", str(port)],
            cwd=REPO,
            env={"DRAFTPEN_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
        )
    assert result.returncode == 1 and f"Cannot listen on 127.0.0.1:{port}" in result.stderr


# -- keepalive ---------------------------------------------------------------------------


def test_keepalive_is_switched_on_for_the_connections_matched_and_no_others():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    watched = socket.create_connection(("127.0.0.1", port))
    other_server = socket.create_server(("127.0.0.1", 0))
    other = socket.create_connection(("127.0.0.1", other_server.getsockname()[1]))
    try:
        count = keepalive.keep_alive_matching(lambda local, remote: remote[1] == port)
        assert count == 1
        assert watched.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert watched.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == keepalive.IDLE_SECONDS
        assert watched.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == keepalive.COUNT
        assert other.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        watched.sendall(b"still open")  # the descriptor it went through was a duplicate
    finally:
        for open_socket in (watched, other, server, other_server):
            open_socket.close()


def test_the_worker_timeout_is_a_setting_and_a_serve_flag():
    assert Settings().worker_timeout == 30.0
    with pytest.raises(SettingsError, match="worker_timeout"):
        Settings(worker_timeout=-1)
    flag = argparse.Namespace(worker_timeout=None)
    assert worker_timeout_from(flag, Settings(worker_timeout=5)) == 5.0
    assert worker_timeout_from(argparse.Namespace(worker_timeout=0.0), Settings()) == 0.0
    with pytest.raises(DraftpenError, match="--worker-timeout"):
        worker_timeout_from(argparse.Namespace(worker_timeout=-2.0), Settings())
