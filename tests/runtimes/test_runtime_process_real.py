"""``draftpen serve``'s runtime process killed mid-reply, with real clients and SmolLM2:
only the replies in flight end, each with a clear error; the others are answered by
the runtime the engine starts again, on the same socket.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.engine_fixtures import wait_until
from tests.support.serve_process import PAIR, RunningServer, start_server

pytestmark = pytest.mark.real_model

CLIENTS = 8
PARALLEL = 4
# A raw-text prompt SmolLM2 continues for a long time.
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"


@dataclass
class Outcome:
    """How one client's streamed reply ended."""

    text: str = ""
    finish_reason: str | None = None
    error: dict[str, Any] | None = None
    done: bool = False  # the stream ended with [DONE]
    began: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    home = tmp_path_factory.mktemp("runtime-kill")
    running = start_server(home, home / "k.sock", "--parallel", str(PARALLEL), "--keep-alive", "-1")
    try:
        yield running
    finally:
        assert running.stop() == 0, running.log()[-3000:]


def stream_completion(server: RunningServer, outcome: Outcome, max_tokens: int) -> None:
    body = {
        "model": PAIR,
        "prompt": COUNTING,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
    }
    with (
        server.client(timeout=300) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                outcome.done = True
                break
            payload = json.loads(data)
            if "error" in payload:
                outcome.error = payload["error"]
                continue
            for choice in payload.get("choices", []):
                outcome.text += choice.get("text") or ""
                outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
            if outcome.text:
                outcome.began.set()


def test_a_runtime_killed_under_parallel_clients_costs_only_the_replies_in_flight(
    server: RunningServer,
) -> None:
    before = server.health()
    engine_pid, runtime_pid = before["pid"], before["runtime"]["pid"]
    assert runtime_pid not in (None, engine_pid)
    outcomes = [Outcome() for _ in range(CLIENTS)]
    threads = [
        threading.Thread(target=stream_completion, args=(server, outcome, 160), daemon=True)
        for outcome in outcomes
    ]
    for thread in threads:
        thread.start()
    assert outcomes[0].began.wait(120), "no reply began"
    wait_until(
        lambda: server.health()["queue"]["running_count"] >= 2, "replies running at once", 60
    )
    os.kill(runtime_pid, signal.SIGKILL)
    for thread in threads:
        thread.join(300)
    assert not any(thread.is_alive() for thread in threads), "a client hangs"

    failed = [outcome for outcome in outcomes if outcome.error is not None]
    answered = [outcome for outcome in outcomes if outcome.error is None]
    assert failed, "the kill came mid-reply: some replies were in flight"
    for outcome in failed:
        assert outcome.error is not None and outcome.error["code"] == "runtime_restarted"
        message = outcome.error["message"]
        assert message.startswith("The engine's runtime restarted: ")
        assert f"(pid {runtime_pid}) was killed by SIGKILL" in message
        # The error is the stream's last event (OpenAI's shape: no [DONE] after it),
        # after what was streamed: the stream ended, none hangs.
        assert not outcome.done and outcome.finish_reason is None
    for outcome in answered:  # those that waited, served by the runtime started again
        assert outcome.done and outcome.finish_reason == "length" and outcome.text

    # The next request is answered on the same socket, by the same engine, with no
    # front end starting anything.
    with server.client(timeout=300) as client:
        answer = client.post(
            "/v1/completions",
            json={"model": PAIR, "prompt": COUNTING, "temperature": 0, "max_tokens": 8},
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"]
    after = server.health()
    assert after["pid"] == engine_pid and server.process.poll() is None
    assert after["runtime"]["restarts"] == 1 and after["runtime"]["state"] == "running"
    assert after["runtime"]["pid"] != runtime_pid
    assert after["queue"]["failed"] == len(failed)
    assert [pair["pair"] for pair in after["loaded"]] == [PAIR]
