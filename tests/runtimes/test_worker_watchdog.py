"""A worker that stops answering: the crash record names it and the way on, forward passes
are timed against the slowest recent one, only the worker the engine waits on is called
hung, and the watchdog breaks a blocked thread free.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.client.crash_report import EngineActivity, activity_path, fatal_path, read_crash
from backends.workers import watchdog
from backends.workers.endpoints import (
    Endpoint,
)
from backends.workers.hang import FIRST_FACTOR, Pace, RuntimeCalls, hung, why
from tests.runtimes.worker_helpers import (
    connection,
)

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
