"""An in-process server over scripted models for Anthropic Messages tests, the tools and
question they ask, and the SDK calls they make.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2

from app.engine.queue import DEFAULT_QUEUE_LIMIT
from app.engine.runner import AgentServer
from app.settings import Settings
from tests.support.byte_model import ScriptedByteModel
from tests.support.scripted_tools import HermesScriptedModel
from tests.support.tui_helpers import RecordingEngine

API_KEY = "test-key-for-tcp"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


@dataclass
class Served:
    """An in-process server over a scripted engine, and the ways to reach it."""

    socket_path: Path
    tcp_url: str
    engine: RecordingEngine

    def sdk(self) -> anthropic.Anthropic:
        """The official SDK, unchanged, over the Unix socket (no key needed there)."""
        transport = httpx2.HTTPTransport(uds=str(self.socket_path))
        return anthropic.Anthropic(
            api_key="unused",
            base_url="http://draftpen",
            http_client=httpx2.Client(transport=transport, timeout=30),
            max_retries=0,
        )

    def raw(self) -> httpx.Client:
        """httpx over the socket, for what the SDK does not show (raw events, bad bodies)."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return httpx.Client(transport=transport, base_url="http://draftpen", timeout=30)


@contextmanager
def messages_server(
    tmp_path: Path,
    replies: Sequence[str],
    model: type[ScriptedByteModel] = HermesScriptedModel,
    queue_limit: int = DEFAULT_QUEUE_LIMIT,
    **model_options: Any,
) -> Iterator[Served]:
    """The real server (Unix socket, and TCP on a free port with :data:`API_KEY`)."""
    engine = RecordingEngine(model(replies, **model_options))
    path = tmp_path / "messages.sock"
    server = AgentServer(
        engine,
        model_id="scripted",
        socket_path=path,
        settings=Settings(drafter="none"),
        configure_logging=False,
        tcp=("127.0.0.1", 0),
        api_key=API_KEY,
        queue_limit=queue_limit,
    )
    addresses: list[str] = []
    listening = threading.Event()

    def announce(address: str) -> None:
        addresses.append(address)
        if address.startswith("http"):
            listening.set()

    thread = threading.Thread(target=server.run, kwargs={"announce": announce})
    thread.start()
    try:
        assert listening.wait(10)
        yield Served(path, addresses[-1].removesuffix("/v1"), engine)
    finally:
        server.stop()
        thread.join(10)


def create(sdk: anthropic.Anthropic, **fields: Any) -> Any:
    """``messages.create`` on the scripted model, greedy, with room to finish."""
    return sdk.messages.create(
        **{"model": "scripted", "max_tokens": 400, "messages": QUESTION, **fields}
    )


def blocks(message: Any) -> list[dict[str, Any]]:
    """A message's content blocks as plain dicts, call ids left out."""
    dumped = [block.model_dump(exclude_none=True) for block in message.content]
    return [{key: value for key, value in block.items() if key != "id"} for block in dumped]
