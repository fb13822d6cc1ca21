"""Workers without a model: addresses, layer shares, the protocol check against servers
written here (another version, a silent one, none), the fit across machines, the worker
command's refusals, keepalive on real sockets, and the crash record naming a lost worker."""

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
from app.client.crash_report import EngineActivity, activity_path, fatal_path, read_crash
from app.engine.worker_options import worker_timeout_from
from app.errors import DraftpenError, SettingsError
from app.models.catalog import ModelEntry, ModelSources
from app.models.fit import MachineMemory, pair_fit
from app.models.worker_memory import with_workers
from app.settings import Settings
from backends.workers import keepalive, watchdog
from backends.workers.cluster import Workers
from backends.workers.endpoints import (
    Endpoint,
    WorkerAddressError,
    is_loopback,
    parse_endpoint,
    parse_endpoints,
)
from backends.workers.hang import FIRST_FACTOR, Connection, Pace, RuntimeCalls, hung, why
from backends.workers.split import parse_split, split_layers
from backends.workers.wire import (
    PROTOCOL,
    WorkerUnreachableError,
    WorkerVersionError,
    compatible,
    probe,
    unreachable,
)
from tests.chat_app.test_cli_generate import REPO

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


def as_at_a_terminal() -> None:
    """In the child before it runs: Ctrl-C's default action, as a command typed at a
    terminal has it (a suite started as a background job has SIGINT ignored, and its
    children would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


# -- the crash record ----------------------------------------------------------------------


def test_a_crash_record_with_a_lost_worker_names_it_and_the_way_on(tmp_path: Path):
    socket_path = tmp_path / "e.sock"
    pid = 4242
    activity_path(socket_path).write_text(
        EngineActivity(pid, "generating", "big", "llamacpp", time.time()).as_json()
    )
    fatal_path(socket_path).write_text(
        f"draftpen engine pid {pid} started now\n"
        "runtime abort: ggml-rpc.cpp:566: Remote RPC server crashed\n"
        "lost worker 10.0.0.2:50052: connection refused\n"
        "Fatal Python error: Aborted\n"
    )
    crash = read_crash(socket_path)
    assert crash is not None and crash.signal_name == "SIGABRT"
    assert crash.lost_workers == ("10.0.0.2:50052",)
    message = crash.message()
    assert message.startswith("Worker 10.0.0.2:50052 stopped answering while generating with")
    assert "'big' (connection refused), and llama.cpp ended" in message
    assert "draftpen worker" in message and "without it" in message
    # A worker the watchdog found hung: its why is said.
    fatal_path(socket_path).write_text(
        f"draftpen engine pid {pid} started now\n"
        "runtime abort: ggml-rpc.cpp:566: Remote RPC server crashed\n"
        f"lost worker 10.0.0.3:50052: {why(31.2, 31.5)}\n"
        "Fatal Python error: Aborted\n"
    )
    hung_crash = read_crash(socket_path)
    assert hung_crash is not None and hung_crash.lost_workers == ("10.0.0.3:50052",)
    assert "stopped answering while generating with pair 'big' (did not answer for 31 s" in (
        hung_crash.message()
    )
    # Without the line, the same abort is the runtime's own.
    fatal_path(socket_path).write_text(
        f"draftpen engine pid {pid} started now\nFatal Python error: Aborted\n"
    )
    plain = read_crash(socket_path)
    assert plain is not None and plain.lost_workers == ()
    assert "runtime crashed (SIGABRT" in plain.message()


# -- the hung-worker watchdog --------------------------------------------------------------


def test_a_forward_pass_may_take_ten_times_the_slowest_recent_one_of_its_kind_and_the_floor():
    pace = Pace()
    assert pace.expected(1) is None
    assert pace.bound(1, floor=30) == 30 * FIRST_FACTOR  # nothing timed yet: a long wait
    for seconds in (0.05, 0.2, 0.06):  # decodes and verifies: the slowest of them counts
        pace.observe(4, seconds)
    assert pace.expected(1) == 0.2 and pace.bound(1, floor=30) == 30
    assert pace.bound(1, floor=1) == pytest.approx(2.0)
    # No prompt chunk timed yet: each of its tokens may take a whole small call.
    assert pace.expected(512) == pytest.approx(0.2 * 512)
    pace.observe(256, 12.8)  # a chunk at 50 ms a token: chunks go by that pace
    assert pace.expected(512) == pytest.approx(25.6)
    assert pace.bound(512, floor=30) == pytest.approx(256)
    # Only the recent calls count: a slow start is forgotten.
    quick = Pace(window=2)
    quick.observe(1, 9.0)
    quick.observe(1, 0.1)
    quick.observe(1, 0.1)
    assert quick.expected(1) == 0.1


def test_a_call_is_timed_while_in_flight_and_then_sets_the_pace():
    timed = RuntimeCalls()
    assert timed.oldest() is None
    with timed.timing(3):
        call = timed.oldest()
        assert call is not None and call.tokens == 3
        assert timed.bound(call, floor=2) == 2 * FIRST_FACTOR
    assert timed.oldest() is None
    assert timed.pace.expected(3) is not None


def connection(port: int, **facts: object) -> Connection:
    return Connection(Endpoint("10.0.0.2", port), port, **facts)  # type: ignore[arg-type]


def test_only_the_silent_worker_the_engine_waits_on_is_called_hung():
    silent_waited = connection(1, waited_on=True, silent_for=40.0)
    answering = connection(2, waited_on=True, silent_for=0.5)  # slow, but moving
    idle = connection(3, waited_on=False, silent_for=40.0)  # nobody waits on it
    assert hung([silent_waited, answering, idle], 30) == [silent_waited]
    assert hung([connection(1, waited_on=True, silent_for=20.0)], 30) == []
    # Outside a timed call, only a wait that is seen counts.
    assert hung([connection(1, silent_for=400.0, unanswered=True)], 300, timed=False) == []
    assert hung([silent_waited], 30, timed=False) == [silent_waited]


def test_without_the_threads_view_an_unanswered_request_stands_in_and_without_both_all_count():
    asked = connection(1, silent_for=40.0, unanswered=True)
    answered = connection(2, silent_for=40.0, unanswered=False)
    assert hung([asked, answered], 30) == [asked]
    unknown = [connection(1), connection(2)]
    assert hung(unknown, 30) == unknown
    assert "did not answer for 41 s" in why(40.6, 33.0)
    assert "did not answer for 33 s" in why(None, 33.0)


@pytest.fixture
def connected_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    server.close()
    yield client, peer
    client.close()
    peer.close()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and TCP_INFO")
def test_the_watchdog_sees_a_thread_blocked_on_a_silent_worker_and_breaks_it_free(
    connected_pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(watchdog, "calls", RuntimeCalls())  # no pace yet
    monkeypatch.setattr(watchdog, "_verdicts", {})
    monkeypatch.setattr(watchdog, "_broken", set())
    client, peer = connected_pair
    endpoint = Endpoint(*peer.getsockname())
    outcome: list[bytes | BaseException] = []

    def wait_for_an_answer() -> None:  # as llama.cpp's RPC thread does, no timeout
        client.sendall(b"request")
        try:
            outcome.append(client.recv(8))
        except OSError as error:
            outcome.append(error)

    thread = threading.Thread(target=wait_for_an_answer, daemon=True)
    time.sleep(0.05)  # the kernel's times are in jiffies: the request after the connect
    thread.start()
    assert peer.recv(7) == b"request"  # the worker got it, and says nothing
    deadline = time.monotonic() + 5
    while (watchdog.waiting_descriptors() or {}).get(client.fileno()) is not True:
        assert time.monotonic() < deadline, "the blocked read was not seen"
        time.sleep(0.02)
    time.sleep(0.3)
    silent_for, unanswered = watchdog.silence(client.fileno())
    assert silent_for is not None and silent_for >= 0.25 and unanswered is True
    peer.sendall(b"answer")
    deadline = time.monotonic() + 5
    while not outcome:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert watchdog.silence(client.fileno())[0] < 0.25  # it spoke just now

    # Blocked again, past a short floor: the timed call is overdue, the connection broken.
    outcome.clear()
    thread = threading.Thread(target=wait_for_an_answer, daemon=True)
    located = {(endpoint.host, endpoint.port): endpoint}
    with watchdog.calls.timing(1):
        thread.start()
        assert peer.recv(7) == b"request"
        time.sleep(0.5)
        assert watchdog.check(located.get, 0.4, time.monotonic(), untimed=False) == []
        time.sleep(0.1)  # the pace is a first call's: FIRST_FACTOR x 0.05 s = 0.5 s
        broken = watchdog.check(located.get, 0.05, time.monotonic(), untimed=False)
        thread.join(5)
    assert [found.endpoint for found in broken] == [endpoint]
    assert outcome == [b""]  # the read returned: llama.cpp's fails and it aborts
    assert "did not answer for" in watchdog.verdicts()[endpoint]
