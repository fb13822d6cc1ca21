"""The engine's runtime in a process of its own: requests and their events cross, and a
runtime that dies costs only the replies in flight.

The runtime here is a real spawned process (``runtime_child``) over scripted models;
the tests kill it with SIGKILL as a fault in llama.cpp would end it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import httpx

from app.engine.runtime_deaths import CrashWindow
from tests.support.engine_fixtures import wait_until
from tests.support.runtime_process import (
    LONG_REPLY,
    ScriptedRuntime,
    chat_body,
    runtime_engine,
)
from tests.support.scripted_tools import PARIS_CALL, WEATHER_TOOL


def sse_payloads(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every JSON payload of a streamed answer, up to ``[DONE]`` or the end."""
    payloads: list[dict[str, Any]] = []
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                payloads.append(json.loads(line.removeprefix("data: ")))
    return payloads


def text_of(payloads: list[dict[str, Any]]) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for payload in payloads
        for choice in payload.get("choices", [])
    )


def test_a_reply_comes_from_the_runtime_process_with_its_statistics(tmp_path: Path) -> None:
    with runtime_engine(tmp_path, ScriptedRuntime(reply="Hello from the runtime.")) as engine:
        with engine.http() as http:
            payloads = sse_payloads(http, chat_body())
            whole = http.post("/v1/chat/completions", json={**chat_body(), "stream": False}).json()
        assert text_of(payloads) == "Hello from the runtime."
        assert payloads[-1]["draftpen"]["generated_tokens"] > 0
        assert whole["choices"][0]["message"]["content"] == "Hello from the runtime."
        health = engine.client().health()
        assert health.runtime is not None and health.runtime.state == "running"
        assert health.runtime.pid not in (None, os.getpid())
        assert [pair.pair for pair in health.loaded] == ["alpha"]
        assert health.queue.completed == 2 and health.loads == 1


def test_logprobs_cross_with_the_bytes_of_their_tokens(tmp_path: Path) -> None:
    with (
        runtime_engine(tmp_path, ScriptedRuntime(reply="Bytes.")) as engine,
        engine.http() as http,
    ):
        answer = http.post(
            "/v1/chat/completions",
            json={**chat_body(), "stream": False, "logprobs": True, "top_logprobs": 2},
        ).json()
    content = answer["choices"][0]["logprobs"]["content"]
    assert "".join(entry["token"] for entry in content).startswith("Bytes.")
    assert all(len(entry["top_logprobs"]) == 2 for entry in content)


def test_tools_and_their_grammar_cross_and_the_call_comes_back(tmp_path: Path) -> None:
    setup = ScriptedRuntime(reply=PARIS_CALL, tools=True)
    with runtime_engine(tmp_path, setup) as engine, engine.http() as http:
        answer = http.post(
            "/v1/chat/completions",
            json={
                **chat_body(),
                "stream": False,
                "tools": [WEATHER_TOOL],
                "tool_choice": "required",
            },
        ).json()
    message = answer["choices"][0]["message"]
    assert answer["choices"][0]["finish_reason"] == "tool_calls", answer
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_a_client_that_goes_away_cancels_its_generation_in_the_runtime(tmp_path: Path) -> None:
    setup = ScriptedRuntime(token_seconds=0.05)
    with runtime_engine(tmp_path, setup) as engine:
        with (
            engine.http() as http,
            http.stream("POST", "/v1/chat/completions", json=chat_body()) as response,
        ):
            for line in response.iter_lines():
                if '"content"' in line:
                    break  # the reply has begun: hang up
        client = engine.client()
        wait_until(lambda: client.health().queue.cancelled == 1, "the cancel", 20)
        assert client.health().queue.running_count == 0


def test_a_runtime_killed_mid_reply_ends_that_reply_with_an_error_and_serves_the_next(
    tmp_path: Path,
) -> None:
    setup = ScriptedRuntime(token_seconds=0.05)
    with runtime_engine(tmp_path, setup, preload="alpha") as engine:
        first_pid = engine.runtime_pid()
        began = threading.Event()
        results: dict[str, list[dict[str, Any]]] = {}

        def stream(name: str, body: dict[str, Any]) -> None:
            with engine.http() as http:
                payloads: list[dict[str, Any]] = []
                with http.stream("POST", "/v1/chat/completions", json=body) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            payloads.append(json.loads(line.removeprefix("data: ")))
                            if name == "running" and text_of(payloads):
                                began.set()
                results[name] = payloads

        running = threading.Thread(target=stream, args=("running", chat_body()))
        running.start()
        assert began.wait(30), "the reply did not begin"
        # One more waits behind it in the queue (one sequence at a time).
        waiting = threading.Thread(target=stream, args=("waiting", chat_body(max_tokens=20)))
        waiting.start()
        wait_until(lambda: engine.client().health().queue.waiting == 1, "the queued request")
        os.kill(first_pid, signal.SIGKILL)
        running.join(60)
        waiting.join(60)

        ended = results["running"]
        error = ended[-1]["error"]
        assert error["code"] == "runtime_restarted"
        assert "The engine's runtime restarted" in error["message"]
        assert "SIGKILL" in error["message"] and "'alpha'" in error["message"]
        assert LONG_REPLY.startswith(text_of(ended[:-1])) and text_of(ended[:-1])
        # The request that waited was kept and answered by the runtime started again.
        assert text_of(results["waiting"]) == LONG_REPLY[:20]
        health = engine.client().health()
        assert health.runtime is not None
        assert health.runtime.restarts == 1 and health.runtime.pid != first_pid
        assert "SIGKILL" in (health.runtime.last_death or "")
        assert [pair.pair for pair in health.loaded] == ["alpha"]  # loaded again
        assert health.queue.failed == 1


def test_a_runtime_that_keeps_dying_is_stopped_and_health_says_why(tmp_path: Path) -> None:
    crashes = CrashWindow(limit=2, window_seconds=600)
    with runtime_engine(tmp_path, ScriptedRuntime(die_on_load=True), crashes=crashes) as engine:
        client = engine.client()
        with engine.http() as http:
            # Each dies loading the pair, before a reply began: a plain client's stream
            # has not started, so the error comes with its status.
            first = http.post("/v1/chat/completions", json=chat_body())
            assert first.status_code == 503
            assert first.json()["error"]["code"] == "runtime_restarted"
            wait_until(lambda: client.health().runtime.state == "running", "the restart", 60)  # type: ignore[union-attr]
            second = http.post("/v1/chat/completions", json=chat_body())
            assert second.status_code == 503
            assert second.json()["error"]["code"] == "runtime_stopped"
            runtime = client.health().runtime
            assert runtime is not None and runtime.state == "stopped"
            assert "2 times within 10 minutes" in (runtime.stopped_reason or "")
            assert "/draftpen/load" in (runtime.stopped_reason or "")
            refused = http.post("/v1/chat/completions", json=chat_body())
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "runtime_stopped"
            # The socket stays open: /health and the models answer.
            assert http.get("/v1/models").status_code == 200
