"""Front ends as clients of a real engine process: ``app.client`` against ``draftpen serve``.

Each test starts the engine the way a front end does (:func:`app.client.ensure_engine`,
a detached ``draftpen serve --idle-exit``) on its own socket, and drives it with
``EngineClient``, the official ``openai`` SDK and httpx, with SmolLM2 as the real
model. The engines of this module share one DRAFTPEN_HOME, so the machine's forward
costs are measured once. The socket's other tenants (another program, an engine of
another API version) are real servers on real Unix sockets.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from app.client import (
    ChatTurn,
    EngineClient,
    EngineLost,
    EngineVersionError,
    Loading,
    NotAnEngineError,
    Waiting,
    engine_log_path,
    ensure_engine,
)
from app.client.wire import API_VERSION
from app.settings import Settings
from backends.base import ChatMessage
from backends.generation_events import GenerationEvent
from backends.sampling.filters import SamplingParams
from tests.chat_app.test_cli_generate import assert_clean_error, run_draftpen
from tests.support.engine_fixtures import scripted_engine_server, wait_until
from tests.support.model_files import SMOLLM2_KEY, require_model

PAIR = "smollm2"
GREEDY = SamplingParams(temperature=0.0)
# A raw-text prompt SmolLM2 continues for a long time: a request that holds the engine.
COUNTING = {"model": PAIR, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "temperature": 0}
# A fixed drafter: the same decoding path whether a request runs alone or among others.
FIXED_DRAFTS = {"drafter": "ngram", "k": 4}


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DRAFTPEN_HOME for this module's engines (forward costs measured once)."""
    return tmp_path_factory.mktemp("engine-home")


@pytest.fixture
def engine_home(shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared home, for this test and the engines it starts."""
    monkeypatch.setenv("DRAFTPEN_HOME", str(shared_home))
    return shared_home


def short_socket(name: str) -> Path:
    """A socket path well under the 107-byte limit (pytest's tmp paths can be long)."""
    directory = Path("/tmp") / f"dp-{os.getpid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory / f"{name}.sock"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_engine(client: EngineClient) -> None:
    """SIGTERM the engine behind ``client`` and wait until it is gone."""
    try:
        pid = client.health().pid
    except EngineLost:
        return
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not pid_alive(pid), f"engine {pid} to stop", seconds=30)


@pytest.fixture
def engine(engine_home: Path, request: pytest.FixtureRequest) -> Iterator[EngineClient]:
    """A fresh engine started as a front end starts it, nothing loaded; stopped after."""
    path = short_socket(request.node.name[:40])
    client = ensure_engine(Settings(), socket_path=path, serve_options=["--keep-alive", "-1"])
    try:
        yield client
    finally:
        stop_engine(client)


def chat_turn(text: str, max_tokens: int = 24) -> ChatTurn:
    return ChatTurn(
        PAIR,
        (ChatMessage("user", text),),
        GREEDY,
        max_tokens=max_tokens,
        drafter="ngram",
        draft_tokens=4,
    )


def chat_text(items: list[Any]) -> str:
    return "".join(item.text for item in items if isinstance(item, GenerationEvent))


def sdk(client: EngineClient) -> openai.OpenAI:
    transport = httpx.HTTPTransport(uds=str(client.socket_path))
    return openai.OpenAI(
        api_key="unused",
        base_url="http://draftpen/v1",
        http_client=httpx.Client(transport=transport, timeout=600),  # a first load measures costs
        max_retries=0,
    )


def sdk_chat(client: openai.OpenAI, text: str, max_tokens: int = 24) -> str:
    answer = client.chat.completions.create(
        model=PAIR,
        messages=[{"role": "user", "content": text}],
        temperature=0,
        max_tokens=max_tokens,
        extra_body={"speculative": FIXED_DRAFTS},
    )
    return answer.choices[0].message.content or ""


# -- starting, finding, refusing: no model needed ----------------------------------------


def test_ensure_engine_starts_one_over_a_stale_socket_and_it_stops_when_idle_and_detached(
    engine_home: Path,
):
    path = short_socket("autostart")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a crashed engine leaves

    statuses: list[str] = []
    client = ensure_engine(
        Settings(), statuses.append, socket_path=path, serve_options=["--idle-exit", "1s"]
    )
    health = client.health()
    assert statuses and statuses[0].startswith(f"Starting the draftpen engine on {path}")
    assert health.service == "draftpen" and health.api_version == API_VERSION
    assert health.loaded == [] and health.idle_exit
    assert "listening on unix:" in engine_log_path().read_text()

    statuses.clear()
    again = ensure_engine(Settings(), statuses.append, socket_path=path)
    assert again.health().pid == health.pid and statuses == []  # found, not started

    with client.attach():
        time.sleep(2.5)  # longer than --idle-exit: an attached front end keeps it
        assert client.health().attached_clients == 1
    wait_until(lambda: not pid_alive(health.pid), "the idle engine to stop", seconds=20)
    assert not path.exists()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the server's ``body`` and ``status``."""

    def do_GET(self) -> None:
        status, body, kind = self.server.answer  # type: ignore[attr-defined]
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def address_string(self) -> str:
        return "unix"


class _UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve_http_on(path: Path, status: int, body: str, kind: str) -> _UnixHttpServer:
    """Another program's HTTP server on the socket path."""
    server = _UnixHttpServer(str(path), _Handler)
    server.answer = (status, body, kind)  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_socket_held_by_another_program_is_refused_naming_the_fix(engine_home: Path):
    path = short_socket("other")
    path.unlink(missing_ok=True)
    other = serve_http_on(path, 404, "<html>not here</html>", "text/html")
    try:
        with pytest.raises(NotAnEngineError, match="not a draftpen engine") as refused:
            ensure_engine(Settings(), socket_path=path)
        assert "DRAFTPEN_SOCKET" in str(refused.value) and str(path) in str(refused.value)
    finally:
        other.shutdown()
        other.server_close()
        path.unlink(missing_ok=True)

    # A program that is not speaking HTTP at all.
    mute = socket.socket(socket.AF_UNIX)
    mute.bind(str(path))
    mute.listen()

    def hang_up() -> None:
        while True:
            try:
                connection, _ = mute.accept()
            except OSError:
                return  # closed by the test
            with connection, contextlib.suppress(OSError):
                connection.sendall(b"SSH-2.0-OpenSSH\r\n")

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        with pytest.raises(NotAnEngineError, match="not a draftpen engine"):
            ensure_engine(Settings(), socket_path=path)
    finally:
        mute.close()
        path.unlink(missing_ok=True)

    path.write_text("a file, not a socket")
    with pytest.raises(NotAnEngineError, match=r"is not a socket.*Remove it"):
        ensure_engine(Settings(), socket_path=path)
    assert path.read_text() == "a file, not a socket"  # nothing of someone else's is touched


def test_an_engine_of_another_api_version_is_refused_naming_how_to_stop_it(engine_home: Path):
    path = short_socket("version")
    path.unlink(missing_ok=True)
    health = {
        "service": "draftpen",
        "status": "ok",
        "version": "9.0.0",
        "api_version": API_VERSION + 1,
        "pid": 4242,
    }
    old = serve_http_on(path, 200, json.dumps(health), "application/json")
    try:
        with pytest.raises(EngineVersionError, match="speaks API") as refused:
            ensure_engine(Settings(), socket_path=path)
    finally:
        old.shutdown()
        old.server_close()
        path.unlink(missing_ok=True)
    message = str(refused.value)
    assert "kill 4242" in message and "9.0.0" in message and f"API {API_VERSION}" in message


# -- a real engine with SmolLM2 ----------------------------------------------------------


def rss(pid: int) -> int:
    """A process's resident memory, in bytes."""
    return psutil.Process(pid).memory_info().rss


@pytest.mark.real_model
def test_chat_and_an_openai_client_at_once_share_one_load(engine: EngineClient):
    model_bytes = require_model(SMOLLM2_KEY).stat().st_size
    assert {card.id: card.loaded for card in engine.pairs()}.get(PAIR) is False
    pid = engine.health().pid
    empty = rss(pid)

    def chat(client: EngineClient) -> list[Any]:
        return list(client.chat(chat_turn("Name a colour.")))

    with ThreadPoolExecutor(max_workers=2) as pool:
        chatted = pool.submit(chat, engine)
        answered = pool.submit(sdk_chat, sdk(engine), "Name a fruit.")
        items, answer = chatted.result(timeout=300), answered.result(timeout=300)
    grown_together = rss(pid) - empty

    assert chat_text(items) and answer
    # One of them loaded the pair while the other waited; the chat saw either.
    assert any(isinstance(item, Loading | Waiting) for item in items)
    health = engine.health()
    assert [pair.pair for pair in health.loaded] == [PAIR] and health.loads == 1
    loaded = [card.id for card in engine.pairs() if card.loaded]
    assert loaded == [PAIR]

    # The memory of one pair: what an engine grows by when it loads the pair once and
    # answers the same two requests one after the other. A second copy of the pair
    # would add its weights and its KV cache again (about as much once more).
    alone = ensure_engine(
        Settings(), socket_path=short_socket("rss-alone"), serve_options=["--keep-alive", "-1"]
    )
    try:
        alone_pid = alone.health().pid
        alone_empty = rss(alone_pid)
        assert chat_text(chat(alone)) and sdk_chat(sdk(alone), "Name a fruit.")
        grown_alone = rss(alone_pid) - alone_empty
    finally:
        stop_engine(alone)
    assert grown_alone > 0.8 * model_bytes  # the weights, read by every forward, are resident
    assert grown_together < 1.5 * grown_alone, (grown_together, grown_alone)


@pytest.fixture
def one_at_a_time(engine_home: Path, request: pytest.FixtureRequest) -> Iterator[EngineClient]:
    """An engine that generates one request at a time (``--parallel 1``), stopped after."""
    path = short_socket(request.node.name[:40])
    options = ["--keep-alive", "-1", "--parallel", "1"]
    client = ensure_engine(Settings(), socket_path=path, serve_options=options)
    try:
        yield client
    finally:
        stop_engine(client)


@pytest.mark.real_model
def test_a_waiting_chat_sees_what_it_waits_behind_then_runs(one_at_a_time: EngineClient):
    # One at a time: a chat waits behind an agent (with several, it runs beside it:
    # tests/test_parallel_serve.py).
    engine = one_at_a_time
    require_model(SMOLLM2_KEY)
    engine.load(PAIR)
    transport = httpx.HTTPTransport(uds=str(engine.socket_path))
    holder = httpx.Client(transport=transport, base_url="http://draftpen", timeout=120)
    items: list[Any] = []
    request = {**COUNTING, "max_tokens": 3000, "stream": True, "speculative": {"drafter": "none"}}
    with holder, holder.stream("POST", "/v1/completions", json=request) as held:
        lines = held.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # generating now
        waiter = threading.Thread(target=lambda: items.extend(engine.chat(chat_turn("Say hi."))))
        waiter.start()
        wait_until(lambda: any(isinstance(item, Waiting) for item in items), "a queue notice")
    # Leaving the block abandons the agent's stream: the engine cancels it, the chat runs.
    waiter.join(120)
    assert items[0] == Waiting(1, ("agent request (smollm2)",))
    assert chat_text(items)
    assert [item for item in items if isinstance(item, GenerationEvent)][-1].finish_reason


@pytest.mark.real_model
def test_many_openai_clients_and_a_chat_at_once_answer_as_each_alone(
    one_at_a_time: EngineClient,
):
    # Queued one at a time, each answer is its answer alone to the token. Several at
    # once on fast kernels part at near-ties (tests/test_server.py); under exact kernels
    # they do not (tests/test_parallel_serve.py).
    engine = one_at_a_time
    require_model(SMOLLM2_KEY)
    topics = ["rivers", "owls", "tea"]
    client = sdk(engine)
    alone = [sdk_chat(client, f"One sentence about {topic}.") for topic in topics]
    chat_alone = chat_text(list(engine.chat(chat_turn("One sentence about maps."))))
    assert len(set(alone)) == len(topics) and chat_alone

    with ThreadPoolExecutor(max_workers=len(topics) + 1) as pool:
        chatted = pool.submit(
            lambda: chat_text(list(engine.chat(chat_turn("One sentence about maps."))))
        )
        together = list(pool.map(lambda t: sdk_chat(client, f"One sentence about {t}."), topics))
        assert chatted.result(timeout=300) == chat_alone
    assert together == alone
    assert engine.health().loads == 1


@pytest.mark.real_model
def test_keep_alive_unloads_the_idle_pair(engine_home: Path):
    require_model(SMOLLM2_KEY)
    path = short_socket("keepalive")
    client = ensure_engine(Settings(), socket_path=path, serve_options=["--keep-alive", "1s"])
    try:
        assert sdk_chat(sdk(client), "Hello!", max_tokens=4)
        assert client.health().keep_alive_seconds == 1.0
        wait_until(lambda: client.health().loaded == [], "keep-alive to unload", seconds=30)
        assert not any(card.loaded for card in client.pairs())
        assert sdk_chat(sdk(client), "Hello again!", max_tokens=4)  # loaded once more
        assert client.health().loads == 2
    finally:
        stop_engine(client)


@pytest.mark.real_model
def test_an_engine_killed_mid_reply_raises_engine_lost_and_a_new_one_starts(engine_home: Path):
    require_model(SMOLLM2_KEY)
    path = short_socket("killed")
    client = ensure_engine(Settings(), socket_path=path)
    pid = client.health().pid
    client.load(PAIR)
    long_reply = ChatTurn(
        PAIR,
        (ChatMessage("user", "Count from 1 to 500, one number a line."),),
        GREEDY,
        max_tokens=2000,
        drafter="none",
    )
    received: list[Any] = []
    with pytest.raises(EngineLost, match="Lost the draftpen engine"):
        for item in client.chat(long_reply):
            received.append(item)
            if sum(isinstance(i, GenerationEvent) for i in received) == 3:
                os.kill(pid, signal.SIGKILL)
    assert chat_text(received)  # what came before the loss is kept by the caller
    wait_until(lambda: not pid_alive(pid), "the killed engine to be gone")

    restarted = ensure_engine(Settings(), socket_path=path)  # over the dead one's socket
    try:
        assert restarted.health().pid != pid
    finally:
        stop_engine(restarted)


@pytest.mark.real_model
def test_bench_through_the_engine_runs_the_suite_as_requests_and_reads_their_stats(
    engine: EngineClient, tmp_path: Path
):
    require_model(SMOLLM2_KEY)  # the engine runs, idle, nothing loaded
    output = tmp_path / "through-engine.json"
    result = run_draftpen(
        "bench",
        "--engine",
        "--pair",
        "smollm2",
        "--max-tokens",
        "16",
        "--category",
        "code_edit",
        "--category",
        "json_schema",
        "--modes",
        "ngram,reference",
        "--output",
        str(output),
        env={"DRAFTPEN_SOCKET": str(engine.socket_path)},
    )
    assert result.returncode == 0, result.stderr
    health = engine.health()
    report = json.loads(output.read_text())
    # It used the engine that ran (nothing was loaded in bench's own process) ...
    assert "Starting the draftpen engine" not in result.stderr
    assert report["through"]["process"] == "engine" and report["through"]["pid"] == health.pid
    assert [pair.pair for pair in health.loaded] == ["smollm2"] and health.loads == 1
    assert "left out with --engine" in result.stderr  # the yardsticks need a local pair
    assert report["costs_ms"] is None and "Through the engine" in result.stdout
    # ... which did the load and answered every generation: one untimed warm-up per mode
    # that applies to the first prompt (plain, n-gram), then each mode on each prompt of
    # both categories.
    code_edit, json_schema = report["results"]["code_edit"], report["results"]["json_schema"]
    assert set(code_edit) == {"plain", "n-gram K=10"}
    assert set(json_schema) == {"plain", "plain, no grammar", "n-gram K=10"}
    assert health.queue.completed == 1 + 2 + 2 * len(code_edit) + 2 * len(json_schema)
    # The figures are the loop's, from the stream's statistics.
    for by_mode in (code_edit, json_schema):
        for label, figures in by_mode.items():
            assert figures["generated_tokens"] > 0 and figures["decode_seconds"] > 0, label
            assert len(figures["run_rates"]) == 2
    assert code_edit["n-gram K=10"]["drafted"] > 0 and code_edit["plain"]["drafted"] == 0
    # The schema reached the engine as response_format: its grammar forced tokens.
    assert json_schema["plain"]["grammar_forced"] > 0
    assert json_schema["plain, no grammar"]["grammar_forced"] == 0


def test_serve_refuses_a_socket_another_program_holds(engine_home: Path):
    path = short_socket("serve-other")
    path.unlink(missing_ok=True)
    other = serve_http_on(path, 404, "<html>not here</html>", "text/html")
    try:
        result = run_draftpen("serve", "--socket", str(path))
    finally:
        other.shutdown()
        other.server_close()
        path.unlink(missing_ok=True)
    assert_clean_error(result, "not a draftpen engine", str(path))


def test_ensure_engine_waits_out_an_engine_that_is_stopping_then_starts_one(
    engine_home: Path, tmp_path: Path
):
    with scripted_engine_server(tmp_path) as stopping:
        stopping.server.queue.shutdown()  # what SIGTERM or --idle-exit starts with
        assert stopping.client().health().status == "shutting_down"
        statuses: list[str] = []

        def hear(text: str) -> None:
            statuses.append(text)
            # Stop the old engine only once ensure_engine has seen it stopping, so a
            # slow machine cannot let it vanish before it is looked at.
            if len(statuses) == 1:
                threading.Timer(0.5, stopping.server.stop).start()

        client = ensure_engine(Settings(), hear, socket_path=stopping.socket_path)
    try:
        health = client.health()
        assert health.status == "ok" and health.pid != os.getpid()  # a new engine process
        assert "is stopping" in statuses[0] and "Starting the draftpen engine" in statuses[1]
    finally:
        stop_engine(client)
