"""TCP lets no one in without the engine's key; the Unix socket needs none.

The engine is real (AgentServer, uvicorn, a real TCP port and a real Unix socket) over
the scripted byte model, so these run in a second; clients are the official ``openai``
and ``anthropic`` SDKs and httpx. The last tests start ``draftpen serve --tcp`` itself
(no pair loaded, so no model is read) to check the key file and what serve prints.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from app.client.api_key import API_KEY_ENV, engine_api_key, stored_api_key
from app.engine.runner import AgentServer
from app.errors import DraftpenError
from app.settings import Settings
from tests.engine.tcp_engine import (
    KEY,
    REPLY,
    tcp_engine,
)
from tests.support.byte_model import ScriptedByteModel
from tests.support.draftpen_cli import REPO
from tests.support.tui_helpers import RecordingEngine

SERVE = (sys.executable, "-m", "app.main", "serve")
QUESTION = {"model": "scripted", "messages": [{"role": "user", "content": "2+3?"}]}


# -- the check ----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/health"])
def test_a_tcp_request_without_the_key_gets_401_and_reaches_nothing(tmp_path: Path, path: str):
    with tcp_engine(tmp_path) as running, running.http() as client:
        response = client.request("POST" if "chat" in path else "GET", path, json=QUESTION)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and "Authorization: Bearer" in error["message"]
    assert KEY not in response.text
    assert running.engine.requests == []


def test_a_wrong_key_is_refused_whichever_header_carries_it(tmp_path: Path):
    with tcp_engine(tmp_path) as running:
        with running.http(authorization=f"Bearer {KEY}x") as client:
            bearer = client.post("/v1/chat/completions", json=QUESTION)
        with running.http(**{"x-api-key": KEY[:-1]}) as client:
            header = client.post("/v1/chat/completions", json=QUESTION)
        with running.http(authorization=f"Basic {KEY}") as client:
            other_scheme = client.post("/v1/chat/completions", json=QUESTION)
        with pytest.raises(openai.AuthenticationError, match="not this draftpen engine's key"):
            running.openai("sk-wrong").chat.completions.create(**QUESTION)  # type: ignore[call-overload]
    assert [bearer.status_code, header.status_code, other_scheme.status_code] == [401] * 3
    assert running.engine.requests == []


def test_the_key_as_a_bearer_token_or_x_api_key_lets_the_request_in(tmp_path: Path):
    with tcp_engine(tmp_path) as running:
        answer = running.openai(KEY).chat.completions.create(**QUESTION, temperature=0)  # type: ignore[call-overload]
        with running.http(**{"x-api-key": KEY}) as client:
            models = client.get("/v1/models")
            health = client.get("/health")
        with running.http(authorization=f"bearer {KEY}") as client:
            lower_scheme = client.get("/v1/models")
    assert answer.choices[0].message.content == REPLY
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "scripted"
    assert health.json()["tcp"] == running.url
    assert lower_scheme.status_code == 200


def test_the_messages_route_refuses_in_anthropics_shape_and_its_sdk_gets_in_with_the_key(
    tmp_path: Path,
):
    with tcp_engine(tmp_path) as running:
        with running.http() as client:
            refused = client.post("/v1/messages", json={"model": "scripted", "max_tokens": 8})
        wrong = anthropic.Anthropic(api_key="wrong", base_url=running.url, max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            wrong.models.list()
        right = anthropic.Anthropic(api_key=KEY, base_url=running.url, max_retries=0)
        pairs = right.models.list()
    assert refused.status_code == 401
    body = refused.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert "API key" in body["error"]["message"]
    assert [pair.id for pair in pairs] == ["scripted"]


def test_the_unix_socket_needs_no_key(tmp_path: Path):
    with tcp_engine(tmp_path) as running, running.unix() as client:
        answer = client.post("/v1/chat/completions", json={**QUESTION, "temperature": 0})
        health = client.get("/health")
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == REPLY
    assert health.json()["tcp"] == running.url


def test_tcp_without_a_key_must_be_asked_for(tmp_path: Path):
    with pytest.raises(ValueError, match="api_key"):
        AgentServer(
            RecordingEngine(ScriptedByteModel([REPLY])),
            socket_path=tmp_path / "e.sock",
            settings=Settings(),
            configure_logging=False,
            tcp=("127.0.0.1", 0),
        )
    with tcp_engine(tmp_path, key=None) as running, running.http() as client:
        assert client.get("/v1/models").status_code == 200


# -- the key and its file -----------------------------------------------------------


def test_the_stored_key_is_made_once_private_and_reused(tmp_path: Path):
    path = tmp_path / "config" / "api-key"
    first = stored_api_key(path)
    assert first.created and len(first.value) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = stored_api_key(path)
    assert second.value == first.value and not second.created
    path.chmod(0o644)  # someone loosened it: it is made private again when read
    assert stored_api_key(path).value == first.value
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert list(path.parent.iterdir()) == [path]  # no scratch file left beside it


def test_an_explicit_key_wins_over_the_environment_which_wins_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "api-key"
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert engine_api_key("from-flag", path).value == "from-flag"
    assert engine_api_key(None, path).value == "from-env"
    assert not path.exists()  # a key from elsewhere makes no file
    monkeypatch.delenv(API_KEY_ENV)
    assert engine_api_key(None, path).value == stored_api_key(path).value
    with pytest.raises(DraftpenError, match="--api-key"):
        engine_api_key("two words", path)


# -- draftpen serve --tcp -----------------------------------------------------------


@dataclass
class Served:
    """A ``draftpen serve`` subprocess with TCP, and what it printed."""

    process: subprocess.Popen[str]
    url: str
    stderr_path: Path

    def stop(self) -> str:
        """SIGTERM, wait, and return what it wrote on stderr."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=30) == 0
        return self.stderr_path.read_text()


def serve_tcp(home: Path, *options: str, env: dict[str, str] | None = None) -> Served:
    """``draftpen serve --tcp 127.0.0.1:0`` with no pair, in ``home``; waits until it listens."""
    socket_path = home / "run.sock"
    stderr_path = home / f"serve-{len(list(home.glob('serve-*')))}.log"
    environment = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [*SERVE, "--socket", str(socket_path), "--tcp", "127.0.0.1:0", *options],
            cwd=REPO,
            env={**environment, "DRAFTPEN_HOME": str(home), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 120)
    line = process.stdout.readline() if ready else ""
    if not line.startswith("draftpen serve: listening on unix:"):
        process.kill()
        pytest.fail(f"serve did not start: {line!r} {stderr_path.read_text()}")
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport, base_url="http://draftpen") as client:
        url = client.get("/health").json()["tcp"]
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
    return Served(process, url, stderr_path)


def test_serve_on_tcp_makes_a_private_key_once_and_asks_for_it_after_a_restart(tmp_path: Path):
    key_file = tmp_path / "config" / "api-key"
    first = serve_tcp(tmp_path)
    try:
        key = key_file.read_text().strip()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        with httpx.Client(base_url=first.url) as client:
            assert client.get("/v1/models").status_code == 401
            keyed = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert keyed.status_code == 200
    finally:
        said = first.stop()
    # Not a terminal: where the key is kept, never the key itself (this may be a log).
    assert f"API key: kept in {key_file}, made just now" in said and key not in said

    second = serve_tcp(tmp_path)
    try:
        with httpx.Client(base_url=second.url) as client:
            assert client.get("/v1/models", headers={"x-api-key": key}).status_code == 200
    finally:
        said = second.stop()
    assert key_file.read_text().strip() == key
    assert f"API key: kept in {key_file}" in said and "made just now" not in said


def test_serve_takes_the_key_from_the_environment_or_lets_everyone_in_when_told(
    tmp_path: Path,
):
    from_env = serve_tcp(tmp_path, env={API_KEY_ENV: "env-key-123"})
    try:
        with httpx.Client(base_url=from_env.url) as client:
            assert client.get("/v1/models", headers={"x-api-key": "env-key-123"}).is_success
    finally:
        said = from_env.stop()
    assert f"API key: ${API_KEY_ENV}" in said
    assert not (tmp_path / "config" / "api-key").exists()

    open_tcp = serve_tcp(tmp_path, "--no-api-key")
    try:
        with httpx.Client(base_url=open_tcp.url) as client:
            assert client.get("/v1/models").status_code == 200
    finally:
        said = open_tcp.stop()
    assert "WARNING" in said and "no API key" in said


def test_key_options_without_tcp_are_refused_in_one_line(tmp_path: Path):
    result = subprocess.run(
        [*SERVE, "--api-key", "abc"],
        cwd=REPO,
        env={**os.environ, "DRAFTPEN_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "draftpen: --api-key and --no-api-key go with --tcp: the Unix socket needs no key "
        "(only this user can reach it)."
    ]
