"""What ``draftpen serve`` refuses and how it stops: bad requests get their 4xx and an
OpenAI error object, a full queue a 503, a second server on the socket no start, and
SIGTERM a clean exit.
"""

from __future__ import annotations

import signal
import stat
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.draftpen_cli import assert_clean_error, run_draftpen
from tests.support.serve_process import (
    COUNTING,
    PAIR,
    RunningServer,
    chat,
    sse_events,
    start_server,
)

BAD_REQUESTS = [
    pytest.param(b'{"model": "smollm2", "messages": [', 400, "invalid_json", None, id="bad-json"),
    pytest.param(b"[1, 2]", 400, "invalid_type", None, id="not-an-object"),
    pytest.param(chat("hi", temperature="hot"), 400, "invalid_type", "temperature", id="type"),
    pytest.param(chat("hi", max_tokens=2.5), 400, "invalid_type", "max_tokens", id="float-int"),
    pytest.param(chat("hi", top_p=3), 400, "invalid_value", "top_p", id="range"),
    pytest.param(
        chat("hi", functions=[]), 400, "unknown_parameter", "functions", id="unknown-field"
    ),
    pytest.param({"model": PAIR}, 400, "missing_required_parameter", "messages", id="missing"),
    pytest.param({**chat("hi"), "model": "gpt-4o"}, 404, "model_not_found", "model", id="model"),
    pytest.param(
        chat("word " * 5000), 400, "context_length_exceeded", "messages", id="long-prompt"
    ),
    pytest.param(b"x" * (2 << 20), 413, "request_too_large", None, id="oversize"),
    pytest.param(
        chat("hi", speculative={"drafter": "model"}),
        400,
        "invalid_value",
        "speculative.drafter",
        id="no-draft-model",
    ),
    pytest.param(
        chat("hi", speculative={"exact": "yes"}),
        400,
        "invalid_type",
        "speculative.exact",
        id="exact-not-bool",
    ),
    pytest.param(
        chat("hi", messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        400,
        "invalid_value",
        "messages[0].content",
        id="image",
    ),
]


@pytest.mark.real_model
@pytest.mark.parametrize(("body", "status", "code", "param"), BAD_REQUESTS)
def test_bad_request_gets_its_4xx_and_an_openai_error_object(
    server: RunningServer, body: bytes | dict[str, Any], status: int, code: str, param: str | None
):
    with server.client() as client:
        if isinstance(body, bytes):
            response = client.post("/v1/chat/completions", content=body)
        else:
            response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] == param
    assert error["type"] == "invalid_request_error" and len(error["message"]) > 20


@pytest.mark.real_model
def test_unknown_paths_and_methods_get_error_objects(server: RunningServer):
    with server.client() as client:
        missing = client.get("/v2/nothing")
        wrong_method = client.get("/v1/chat/completions")
    assert missing.status_code == 404
    assert "/v1/chat/completions" in missing.json()["error"]["message"]
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["message"]


@pytest.mark.real_model
def test_openai_sdk_raises_the_servers_error(server: RunningServer):
    with pytest.raises(openai.BadRequestError, match="context"):
        server.openai().chat.completions.create(**chat("word " * 5000, max_tokens=10))


@pytest.mark.real_model
def test_max_tokens_far_above_the_room_is_a_ceiling_at_the_context_end(server_home: Path):
    # As llama.cpp's server and Ollama read it: opencode sends max_tokens 32000 whatever
    # the context, and the reply stops where the context is full.
    small = start_server(server_home, server_home / "ceiling.sock", "--context", "256")
    try:
        context = small.health()["loaded"][0]["context_length"]
        # A whole context of tokens: minutes when others share this machine's cores.
        with small.client(timeout=600) as client:
            counted = client.post("/v1/completions", json={**COUNTING, "max_tokens": 100_000})
        sdk = (
            small.openai()
            .with_options(timeout=600)
            .chat.completions.create(**chat("Count to 3.", max_tokens=32_000))
        )
    finally:
        assert small.stop() == 0
    assert counted.status_code == 200, counted.text
    body = counted.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == context
    assert sdk.usage is not None and sdk.usage.total_tokens <= context
    assert sdk.choices[0].finish_reason in ("stop", "length")


@pytest.mark.real_model
def test_second_server_on_the_same_socket_is_refused(server: RunningServer):
    started = time.monotonic()
    result = run_draftpen("serve", "--pair", PAIR, "--socket", str(server.socket_path))
    assert_clean_error(result, f"already running on {server.socket_path}")
    assert time.monotonic() - started < 30  # refused before loading the model
    assert server.health()["status"] == "ok"
    assert stat.S_ISSOCK(server.socket_path.stat().st_mode)


@pytest.mark.real_model
def test_queue_over_its_bound_gets_503_with_retry_after(server_home: Path):
    # One sequence: a second request waits (with several, it would run beside it).
    running = start_server(server_home, server_home / "q.sock", "--queue", "1", "--parallel", "1")
    try:
        holder = running.client()
        waiter_result: dict[str, httpx.Response] = {}

        def wait_in_queue() -> None:
            with running.client() as client:
                waiter_result["response"] = client.post(
                    "/v1/completions", json={**COUNTING, "max_tokens": 4}
                )

        request = {**COUNTING, "max_tokens": 3000, "stream": True}
        with holder.stream("POST", "/v1/completions", json=request) as held:
            # Keep the event iterator: dropping it would close the held stream early.
            held_events = sse_events(held.iter_lines())
            assert isinstance(next(held_events), dict)  # generating now
            waiter = threading.Thread(target=wait_in_queue)
            waiter.start()
            deadline = time.monotonic() + 10
            while running.health()["queue"]["waiting"] < 1:
                assert time.monotonic() < deadline, running.health()
                time.sleep(0.02)
            with running.client() as client:
                refused = client.post("/v1/completions", json={**COUNTING, "max_tokens": 4})
        holder.close()  # the held stream is abandoned: the waiting request runs next
        waiter.join(timeout=60)
        assert refused.status_code == 503
        assert refused.headers["Retry-After"].isdigit()
        assert refused.json()["error"]["code"] == "queue_full"
        assert waiter_result["response"].status_code == 200
    finally:
        running.stop()


@pytest.mark.real_model
def test_sigterm_cancels_in_flight_work_removes_the_socket_and_exits_0(server_home: Path):
    running = start_server(server_home, server_home / "t.sock")
    with running.client() as client:
        request = {**COUNTING, "max_tokens": 3000, "stream": True}
        with client.stream("POST", "/v1/completions", json=request) as response:
            events = sse_events(response.iter_lines())
            assert isinstance(next(events), dict)
            running.process.send_signal(signal.SIGTERM)
            rest = list(events)
    assert rest[-1] == "[DONE]"
    assert rest[-2]["choices"][0]["finish_reason"] == "cancelled"
    assert running.process.wait(timeout=30) == 0, running.log()
    assert not running.socket_path.exists()
    assert running.process.stdout is not None
    assert running.process.stdout.read() == ""  # stdout: the one "listening" line only
    assert "server shutting down" in running.log()
