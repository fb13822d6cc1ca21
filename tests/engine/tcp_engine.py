"""A real engine (AgentServer, uvicorn) over a scripted model on a real TCP port and a Unix
socket, with or without an API key, for the tests of who may come in.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from app.engine.runner import AgentServer
from app.settings import Settings
from tests.support.byte_model import ScriptedByteModel
from tests.support.tui_helpers import RecordingEngine

KEY = "k3y-for-tests_0123456789"
REPLY = "Five."


@dataclass
class TcpEngine:
    """An in-process engine listening on a Unix socket and on a TCP port."""

    url: str
    socket_path: Path
    engine: RecordingEngine

    def http(self, **headers: str) -> httpx.Client:
        """httpx over TCP, sending ``headers``."""
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def unix(self) -> httpx.Client:
        """httpx over the Unix socket, no key."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return httpx.Client(transport=transport, base_url="http://draftpen", timeout=30)

    def openai(self, key: str) -> openai.OpenAI:
        """The official OpenAI SDK over TCP with ``key`` (sent as a bearer token)."""
        return openai.OpenAI(api_key=key, base_url=f"{self.url}/v1", max_retries=0)


@contextmanager
def tcp_engine(tmp_path: Path, key: str | None = KEY) -> Iterator[TcpEngine]:
    """A scripted engine on ``tmp_path``'s socket and a free loopback port."""
    engine = RecordingEngine(ScriptedByteModel([REPLY]))
    server = AgentServer(
        engine,
        model_id="scripted",
        socket_path=tmp_path / "e.sock",
        settings=Settings(drafter="none", temperature=0.0),
        configure_logging=False,
        tcp=("127.0.0.1", 0),
        api_key=key,
        tcp_without_key=key is None,
    )
    listening = threading.Event()
    thread = threading.Thread(target=server.run, kwargs={"announce": lambda _: listening.set()})
    thread.start()
    try:
        assert listening.wait(10)
        assert server.api.tcp_url is not None
        yield TcpEngine(server.api.tcp_url, tmp_path / "e.sock", engine)
    finally:
        server.stop()
        thread.join(10)
