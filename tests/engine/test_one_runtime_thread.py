"""llama.cpp computes on one thread per process (issue 34).

The OpenMP build of llama.cpp's CPU kernels slows every forward pass once a second thread
of the process has computed a graph: libgomp then manages more threads than there are
CPUs and stops spinning at the barriers between operations (measured on 2 cores: plain
decoding 0.75x). ``draftpen serve --pair`` used to load, and in a new home calibrate by
decoding, on the main thread, then generate on the queue's worker: the engine decoded
at 0.75x of ``draftpen generate``. Now every piece of model work runs on the worker.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from app.engine.jobs import ShuttingDownError
from app.engine.queue import GenerationQueue
from app.engine.scheduler import LoadOptions, PairScheduler
from tests.support.serve_process import chat, start_server


def unused_loader(name: str, options: LoadOptions, report: object) -> object:
    raise AssertionError("nothing should be loaded")


def test_work_handed_to_the_queue_runs_on_its_worker_and_raises_what_it_raised() -> None:
    queue = GenerationQueue(PairScheduler(unused_loader, LoadOptions(4096, False)), max_waiting=4)
    queue.start()
    try:
        assert queue.run_on_worker(lambda: threading.current_thread().name) == "draftpen-engine"
        with pytest.raises(ValueError, match="no such pair"):
            queue.run_on_worker(lambda: int("no such pair"))
        # The worker lives on after the error.
        assert queue.run_on_worker(lambda: 2 + 3) == 5
    finally:
        queue.shutdown()
        assert queue.join(10)
    with pytest.raises(ShuttingDownError):
        queue.run_on_worker(lambda: None)


def test_a_second_thread_running_llama_cpp_is_said_in_the_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    library = pytest.importorskip("backends.llamacpp.library")
    monkeypatch.setattr(library, "_decoding_threads", set())
    caplog.set_level(logging.WARNING, logger="draftpen.llamacpp")
    library.note_decoding_thread()
    library.note_decoding_thread()
    assert library.decoding_threads() == 1
    assert "second thread" not in caplog.text
    other = threading.Thread(target=library.note_decoding_thread)
    other.start()
    other.join()
    assert library.decoding_threads() == 2
    assert "second thread" in caplog.text


@pytest.mark.real_model
def test_serve_with_a_pair_loads_and_generates_on_one_thread(tmp_path: Path) -> None:
    # A new home: loading measures the pair's forward costs, which decodes.
    home = tmp_path / "home"
    home.mkdir()
    server = start_server(home, tmp_path / "s.sock")
    try:
        assert list((home / "cache" / "calibration").glob("*.json")), "no calibration ran"
        with server.client() as client:
            for _ in range(2):
                reply = client.post(
                    "/v1/chat/completions", json=chat("Count to five.", max_tokens=8)
                )
                assert reply.status_code == 200, reply.text
    finally:
        server.stop()
    assert "second thread" not in server.log(), server.log()
