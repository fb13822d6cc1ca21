"""A real ``draftpen serve`` process for tests: started as a front end starts it, waited for
on its one "listening" line, stopped and its log read back; and the requests the tests send.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.draftpen_cli import REPO
from tests.support.model_files import DRAFT_KEY, SMOLLM2_KEY, TARGET_KEY, models_dir, require_model

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


def start_server(
    home: Path, socket_path: Path, *options: str, pair: str | None = PAIR
) -> RunningServer:
    """Start ``draftpen serve --pair smollm2`` (or ``pair``; None: ``options`` name the
    models, ``--target``/``--draft``) and wait until it listens."""
    if pair == PAIR:
        require_model(SMOLLM2_KEY)
    log_path = home / f"serve-{socket_path.stem}.log"
    with log_path.open("w") as log:
        command = [sys.executable, "-m", "app.main", "serve"]
        command += ["--pair", pair] if pair is not None else []
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
    tmp_path_factory: pytest.TempPathFactory,
    home_name: str,
    *options: str,
    exact_output: bool = False,
) -> Iterator[RunningServer]:
    """``draftpen serve --pair starter OPTIONS`` in a new home, for a module's fixture;
    ``exact_output``: the home's settings load exact kernels, so that one greedy request
    sent twice gets one reply (the fastest kernels may round a near-tie either way)."""
    require_model(TARGET_KEY)
    require_model(DRAFT_KEY)
    home = tmp_path_factory.mktemp(home_name)
    if exact_output:
        (home / "config").mkdir()
        (home / "config" / "settings.toml").write_text("exact_output = true\n")
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
