"""A real engine process for tests, started the way a front end starts it
(:func:`app.client.ensure_engine`), on a short socket path, and stopped for sure; with the
chat and openai-SDK requests the tests send it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.client import (
    EngineClient,
    EngineLost,
    ensure_engine,
)
from app.settings import Settings
from backends.generation_events import GenerationEvent
from backends.sampling.filters import SamplingParams
from tests.support.engine_fixtures import wait_until

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
