"""``draftpen serve`` end to end: the real server on a Unix socket, real clients, SmolLM2.

The real-model tests start ``draftpen serve`` as a subprocess, wait for its one line
on stdout, and talk to it with the official ``openai`` SDK, httpx and curl over the
socket. The tests without a model check the socket's safety rules directly, with an
in-process server over a fake model where a server is needed.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.engine.runner import AgentServer
from app.engine.unix_socket import (
    bind_unix_socket,
    default_socket_path,
    peer_uid,
    prepare_socket_dir,
)
from app.errors import ServerAlreadyRunningError
from app.settings import Settings
from backends.engine import Engine
from tests.chat_app.test_cli_generate import REPO, assert_clean_error, run_draftpen
from tests.support.fakes import HashModel
from tests.support.model_files import DRAFT_KEY, SMOLLM2_KEY, TARGET_KEY, models_dir, require_model
from tests.support.real_runtimes import assert_parts_only_at_a_near_tie

PAIR = "smollm2"
LISTENING = "draftpen serve: listening on unix:"
# A raw-text prompt SmolLM2 continues for a long time: a request that holds the engine.
COUNTING = {"model": PAIR, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "temperature": 0}


@dataclass
class RunningServer:
    """A ``draftpen serve`` subprocess and the ways to reach it."""

    process: subprocess.Popen[str]
    socket_path: Path
    log_path: Path

    def client(self, timeout: float = 60.0) -> httpx.Client:
        """An httpx client bound to the socket."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return httpx.Client(transport=transport, base_url="http://draftpen", timeout=timeout)

    def openai(self) -> openai.OpenAI:
        """The official SDK, unchanged, over the socket."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return openai.OpenAI(
            api_key="unused",
            base_url="http://draftpen/v1",
            http_client=httpx.Client(transport=transport, timeout=60.0),
            max_retries=0,
        )

    def health(self) -> dict[str, Any]:
        with self.client(timeout=10.0) as client:
            return client.get("/health").json()

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def start_server(home: Path, socket_path: Path, *options: str, pair: str = PAIR) -> RunningServer:
    """Start ``draftpen serve --pair smollm2`` (or ``pair``) and wait until it listens."""
    if pair == PAIR:
        require_model(SMOLLM2_KEY)
    log_path = home / f"serve-{socket_path.stem}.log"
    with log_path.open("w") as log:
        command = [sys.executable, "-m", "app.main", "serve", "--pair", pair]
        process = subprocess.Popen(
            [*command, "--socket", str(socket_path), *options],
            cwd=REPO,
            env={
                **os.environ,
                "DRAFTPEN_HOME": str(home),
                "DRAFTPEN_MODELS_DIR": str(models_dir()),
            },
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    assert process.stdout is not None
    # Loading includes measuring forward costs once per home: slow on a busy machine.
    ready, _, _ = select.select([process.stdout], [], [], 300)
    line = process.stdout.readline() if ready else ""
    if not line.startswith(LISTENING):
        process.kill()
        pytest.fail(f"draftpen serve did not start: {line!r}\n{log_path.read_text()}")
    assert line.strip() == f"{LISTENING}{socket_path}"
    return RunningServer(process, socket_path, log_path)


def start_starter_server(
    tmp_path_factory: pytest.TempPathFactory, home_name: str, *options: str
) -> Iterator[RunningServer]:
    """``draftpen serve --pair starter OPTIONS`` in a new home, for a module's fixture."""
    require_model(TARGET_KEY)
    require_model(DRAFT_KEY)
    home = tmp_path_factory.mktemp(home_name)
    running = start_server(home, home / "starter.sock", *options, pair="starter")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def server_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DRAFTPEN_HOME for the module's servers, so the cost calibration is measured once."""
    return tmp_path_factory.mktemp("serve-home")


@pytest.fixture(scope="module")
def server(server_home: Path) -> Iterator[RunningServer]:
    """The shared server, for tests that leave it as they found it."""
    running = start_server(server_home, server_home / "s.sock")
    yield running
    running.stop()


def chat(text: str, **fields: Any) -> dict[str, Any]:
    """A greedy one-turn chat request."""
    return {
        "model": PAIR,
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        **fields,
    }


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any] | str]:
    """The payloads of server-sent events: parsed JSON, or the final "[DONE]"."""
    for line in lines:
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            yield payload if payload == "[DONE]" else json.loads(payload)


# -- the real server, real clients ------------------------------------------------------


@pytest.mark.real_model
def test_models_and_health_answer_over_the_socket(server: RunningServer):
    with server.client() as client:
        models = client.get("/v1/models").json()
        health = client.get("/health").json()
    # Every downloaded pair is listed; the one serve --pair loaded says so.
    cards = {model["id"]: model for model in models["data"]}
    assert cards[PAIR]["loaded"] is True
    assert [name for name, card in cards.items() if card["loaded"]] == [PAIR]
    assert health["status"] == "ok" and health["service"] == "draftpen"
    assert [loaded["pair"] for loaded in health["loaded"]] == [PAIR]
    assert health["queue"]["running"] is None and health["queue"]["waiting"] == 0


@pytest.mark.real_model
def test_socket_file_is_0600(server: RunningServer):
    info = server.socket_path.stat()
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600


@pytest.mark.real_model
def test_greedy_answer_over_the_socket_equals_draftpen_generate(server: RunningServer):
    prompt = "Write one sentence about the sea."
    generated = run_draftpen(
        "generate",
        "--pair",
        PAIR,
        "--drafter",
        "none",
        "--temperature",
        "0",
        "--max-tokens",
        "40",
        "--json",
        "--prompt",
        prompt,
        env={"DRAFTPEN_MODELS_DIR": str(models_dir())},
    )
    assert generated.returncode == 0, generated.stderr
    expected = json.loads(generated.stdout)["text"]
    assert expected

    # The same decoding as generate's: this compares the server's path (template,
    # tokens, sampling, stop handling), not speculation (see the prediction test).
    answer = server.openai().chat.completions.create(
        model=PAIR,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=40,
        extra_body={"speculative": {"drafter": "none"}},
    )
    assert answer.choices[0].message.content == expected
    assert answer.usage is not None
    assert (
        answer.usage.completion_tokens == json.loads(generated.stdout)["stats"]["generated_tokens"]
    )


@pytest.mark.real_model
def test_openai_sdk_streams_the_same_answer_with_stats_in_every_chunk(server: RunningServer):
    client = server.openai()
    # One fixed drafter for both, so that both take exactly the same decoding path.
    request = chat("Name three fruits.", max_tokens=32)
    request["extra_body"] = {"speculative": {"drafter": "ngram", "k": 4}}
    whole = client.chat.completions.create(**request)
    chunks = list(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    # Every chunk carries the running statistics; the last carries usage.
    generated = [c.model_extra["draftpen"]["generated_tokens"] for c in chunks]
    assert generated == sorted(generated)
    assert all("acceptance_rate" in c.model_extra["draftpen"] for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == generated[-1]


def assert_writes_plain_decodings_text(plain: Any, tokens: list[Any], label: str) -> None:
    """Greedy tokens (logprobs entries) equal plain decoding's ``plain`` (entries with
    their two best alternatives), or part from them only where plain decoding's two best
    tokens nearly tied: the server loads llama.cpp's fastest kernels (exact_output off),
    under which a verify batch may round a near-tie the other way (docs/speculation.md)."""
    plain_tokens = [entry.token for entry in plain]
    other_tokens = [entry.token for entry in tokens]
    if other_tokens == plain_tokens:
        return

    def gap_at(index: int, token: str) -> float:
        alternatives = {top.token: top.logprob for top in plain[index].top_logprobs}
        return plain[index].logprob - alternatives.get(token, float("-inf"))

    assert_parts_only_at_a_near_tie(plain_tokens, other_tokens, gap_at, label)


@pytest.mark.real_model
def test_prediction_drafts_the_answer_and_usage_counts_it(server: RunningServer):
    client = server.openai()
    request = chat("List the days of the week.", max_tokens=40, logprobs=True, top_logprobs=2)
    answer = client.chat.completions.create(
        **request, extra_body={"speculative": {"drafter": "none"}}
    ).choices[0]
    plain, plain_logprobs = answer.message.content, answer.logprobs.content
    assert plain and plain_logprobs
    # With a fixed drafter, a prediction is the draft source (Engine.policy_for).
    steer = {"speculative": {"drafter": "ngram", "k": 8}}
    right = client.chat.completions.create(
        **request, prediction={"type": "content", "content": plain}, extra_body=steer
    )
    assert_writes_plain_decodings_text(
        plain_logprobs, right.choices[0].logprobs.content, "right prediction"
    )
    details = right.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert (
        details.accepted_prediction_tokens + details.rejected_prediction_tokens
        == (right.model_extra["draftpen"]["drafted"])
    )
    assert right.model_extra["draftpen"]["target_passes"] < right.usage.completion_tokens

    wrong = "Zebras eat grass in the savanna every single afternoon, as they always do."
    streamed = list(
        client.chat.completions.create(
            **request,
            prediction={"type": "content", "content": wrong},
            extra_body=steer,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    # A wrong prediction costs time, never correctness.
    streamed_logprobs = [
        entry
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for entry in c.choices[0].logprobs.content or ()
    ]
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert_writes_plain_decodings_text(plain_logprobs, streamed_logprobs, "wrong prediction")
    assert streamed[-1].usage.completion_tokens_details.rejected_prediction_tokens > 0


@pytest.mark.real_model
def test_httpx_completions_and_curl_work_over_the_socket(server: RunningServer):
    with server.client() as client:
        response = client.post("/v1/completions", json={**COUNTING, "max_tokens": 6})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6

    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    socket_option = ["--unix-socket", str(server.socket_path)]
    models = subprocess.run(
        [curl, "-sS", *socket_option, "http://draftpen/v1/models"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert PAIR in [card["id"] for card in json.loads(models.stdout)["data"]]
    body = json.dumps(chat("Say hello.", max_tokens=8, stream=True))
    url = "http://draftpen/v1/chat/completions"
    streamed = subprocess.run(
        [
            curl,
            "-sS",
            "-N",
            *socket_option,
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    events = list(sse_events(iter(streamed.stdout.splitlines())))
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.real_model
def test_eight_concurrent_clients_get_complete_uncrossed_answers(server: RunningServer):
    """Eight at once on the default engine (``--parallel auto``: four sequences batched,
    fast kernels): each gets its own answer, token for token the one it got alone but
    where a batch rounded a near-tie the other way (tests/test_parallel_serve.py holds
    exact kernels to equality)."""
    topics = ["cats", "rain", "bread", "trains", "music", "mountains", "coffee", "stars"]
    requests = [
        chat(
            # Five alternatives: a batch may round a three-way near-tie to the third.
            f"Write one short sentence about {topic}.",
            max_tokens=24,
            logprobs=True,
            top_logprobs=5,
        )
        for topic in topics
    ]
    sdk = server.openai()
    alone = [sdk.chat.completions.create(**request).choices[0] for request in requests]
    assert len({choice.message.content for choice in alone}) == len(topics)

    def ask(request: dict[str, Any]) -> list[Any]:
        chunks = sdk.chat.completions.create(**request, stream=True)
        return [
            entry
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for entry in c.choices[0].logprobs.content or []
        ]

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        concurrent = list(pool.map(ask, requests))
    for topic, choice, tokens in zip(topics, alone, concurrent, strict=True):
        assert_writes_plain_decodings_text(choice.logprobs.content, tokens, topic)


@pytest.mark.real_model
def test_client_disconnecting_mid_stream_frees_the_engine(server: RunningServer):
    before = server.health()["queue"]["cancelled"]
    with server.client() as client:
        request = {**COUNTING, "max_tokens": 3000, "stream": True}
        request["speculative"] = {"drafter": "none"}
        with client.stream("POST", "/v1/completions", json=request) as response:
            events = sse_events(response.iter_lines())
            for _ in range(3):
                assert isinstance(next(events), dict)
        # Leaving both blocks closes the connection mid-stream.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        queue = server.health()["queue"]
        if queue["cancelled"] > before and queue["running"] is None:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the abandoned generation was not cancelled: {server.health()}")

    with server.client() as client:
        after = client.post("/v1/completions", json={**COUNTING, "max_tokens": 4})
    assert after.status_code == 200
    assert after.json()["usage"]["completion_tokens"] == 4
    assert "cancelled after" in server.log() and "client disconnected" in server.log()


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
def test_an_agents_second_turn_reports_its_resent_prefix_as_cached(server: RunningServer):
    # Agents resend their whole prompt every turn: a long system prompt, the turns so
    # far, one short new message. The engine reads only what is new, and says so.
    system = "You are a careful coding agent. Project notes follow.\n" + "".join(
        f"Note {index}: the function step_{index} returns {index * 7} for valid input.\n"
        for index in range(120)
    )
    first_turn: list[dict[str, str]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "What does step_3 return?"},
    ]
    sdk = server.openai()
    first = sdk.chat.completions.create(**chat("", messages=first_turn, max_tokens=24))
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And step_4?"},
    ]
    chunks = list(
        sdk.chat.completions.create(
            **chat("", messages=second_turn, max_tokens=8),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert first.usage is not None and first.usage.prompt_tokens > 1500
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    # All that turn 1 read is reused; only its reply and the new question are read.
    assert first.usage.prompt_tokens - 4 <= cached < usage.prompt_tokens
    assert usage.prompt_tokens - cached < 60


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


# -- the socket's rules, no model needed --------------------------------------------------


def test_peer_uid_is_read_from_the_socket():
    if not hasattr(socket, "SO_PEERCRED"):
        pytest.skip("SO_PEERCRED is Linux only")
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        assert peer_uid(left) == os.getuid()


def test_connection_from_another_uid_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    if not hasattr(socket, "SO_PEERCRED"):
        pytest.skip("SO_PEERCRED is Linux only")
    engine = Engine(HashModel())
    path = tmp_path / "peer.sock"
    server = AgentServer(
        engine,
        model_id="fake",
        socket_path=path,
        settings=Settings(drafter="none"),
        allowed_uid=os.getuid() + 1,
        configure_logging=False,
    )
    listening = threading.Event()
    thread = threading.Thread(target=server.run, kwargs={"announce": lambda _: listening.set()})
    thread.start()
    try:
        assert listening.wait(10)
        transport = httpx.HTTPTransport(uds=str(path))
        with httpx.Client(transport=transport) as client, pytest.raises(httpx.TransportError):
            client.get("http://draftpen/health")
    finally:
        server.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert f"refused a connection from uid {os.getuid()}" in caplog.text
    assert not path.exists()


def test_stale_socket_is_replaced_and_a_live_one_is_not(tmp_path: Path):
    path = tmp_path / "s.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: what a crashed server leaves
    live = bind_unix_socket(path)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with pytest.raises(ServerAlreadyRunningError, match=f"already running on {path}"):
            bind_unix_socket(path)
    finally:
        live.close()


def test_default_socket_lives_in_a_private_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("DRAFTPEN_HOME")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = default_socket_path()
    assert path == tmp_path / "draftpen" / "draftpen.sock"
    (tmp_path / "draftpen").mkdir(mode=0o755)
    prepare_socket_dir(path, private=True)
    assert stat.S_IMODE((tmp_path / "draftpen").stat().st_mode) == 0o700

    monkeypatch.delenv("XDG_RUNTIME_DIR")
    if sys.platform == "linux":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        fallback = default_socket_path()
        assert fallback == tmp_path / "cache" / "draftpen" / "run" / "draftpen.sock"
        prepare_socket_dir(fallback, private=True)
        assert stat.S_IMODE(fallback.parent.stat().st_mode) == 0o700


def test_bad_tcp_address_is_one_line():
    result = run_draftpen("serve", "--pair", PAIR, "--tcp", "localhost")
    assert_clean_error(result, "--tcp wants HOST:PORT")
