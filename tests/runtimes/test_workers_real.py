"""A target split over `draftpen worker`s (llama.cpp's RPC), with real workers.

Every worker here is a real ``draftpen worker`` process on 127.0.0.1 (one thread each),
serving llama.cpp's RPC from this draftpen's own llama.cpp library; the engines are
real ``draftpen serve`` processes with SmolLM2 split over this machine and two workers.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.client import (
    ChatTurn,
    EngineClient,
    EngineRuntimeRestartedError,
    crash_report,
    ensure_engine,
)
from app.client.engine_log import engine_log_path
from app.client.errors import EngineRequestError
from app.settings import Settings
from backends.base import ChatMessage
from backends.generation_events import GenerationEvent
from backends.sampling.filters import SamplingParams
from backends.workers.endpoints import Endpoint
from backends.workers.wire import PROTOCOL, probe, unreachable
from tests.runtimes.real_workers import (
    WORKER_COMMAND,
    Worker,
    free_port,
    start_worker,
)
from tests.support.draftpen_cli import REPO
from tests.support.engine_process import short_socket, stop_engine
from tests.support.model_files import SMOLLM2_KEY, models_dir, require_model
from tests.support.real_engine_app import COUNT_PROMPT
from tests.support.serve_process import RunningServer, chat, start_server

pytestmark = pytest.mark.real_model


PAIR = "smollm2"
SMOLLM2_FILE = "smollm2-135m-instruct-q4_1.gguf"


def greedy_reply(server: RunningServer, text: str) -> str:
    with server.client(timeout=120) as client:
        answer = client.post("/v1/chat/completions", json=chat(text, max_tokens=48))
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


def test_a_worker_answers_in_this_draftpens_protocol_and_says_its_memory(home: Path) -> None:
    worker = start_worker(home)
    try:
        info = probe(worker.endpoint)
        assert info.protocol == PROTOCOL  # the pin in wire.py is this build's protocol
        assert len(info.devices) == 1 and 0 < info.devices[0].free <= info.devices[0].total
    finally:
        worker.stop()
    assert worker.process.returncode == 0  # Ctrl-C (SIGINT) stops it cleanly
    assert "draftpen worker stopped." in worker.log.read_text()
    assert unreachable(worker.endpoint) is not None  # and nothing listens any more


def test_the_target_split_over_two_workers_writes_what_it_writes_alone(
    home: Path, two_workers: tuple[Worker, Worker]
) -> None:
    require_model(SMOLLM2_KEY)
    first, second = two_workers
    prompts = ["Name three colours.", "What is 2 + 2? Answer in one sentence."]
    alone = start_server(home, short_socket("alone"))
    try:
        expected = [greedy_reply(alone, prompt) for prompt in prompts]
        assert alone.health()["loaded"][0]["target_placement"] == "this machine"
    finally:
        alone.stop()
    workers = f"{first.address},{second.address}"
    # A third each: by free memory they would be about equal here, but the three
    # processes see the machine's free memory at different moments.
    options = ("--workers", workers, "--worker-split", "1,1,1")
    split = start_server(home, short_socket("split"), *options)
    try:
        assert [greedy_reply(split, prompt) for prompt in prompts] == expected
        loaded = split.health()["loaded"][0]
        assert loaded["target_placement"] == (
            f"10 layers on this CPU, ~10 on {first.address}, ~10 on {second.address}"
        )
    finally:
        split.stop()
    for worker in (first, second):
        assert "Accepted client connection" in worker.log.read_text()


DRAFT_STAYS_LOCAL = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from backends.llamacpp.model import LlamaCppModel
    from backends.workers.cluster import Workers

    path, addresses = sys.argv[1], sys.argv[2]
    workers = Workers.parse(addresses, "1,1,1")
    target = LlamaCppModel(path, n_ctx=256, workers=workers.ask(), worker_split=workers.weights)
    draft = LlamaCppModel(path, n_ctx=256)
    target.forward(draft.tokenize("Hello"))  # the split target computes on the workers
    print("placements", target.placement, "|", draft.placement, flush=True)
    sys.stdin.readline()  # the test stops the workers here
    tokens = draft.tokenize("The capital of France is")
    out = []
    row = draft.forward(tokens)[-1]
    for _ in range(8):
        out.append(int(np.argmax(row)))
        row = draft.forward([out[-1]])[-1]
    print("draft", out, flush=True)
    os._exit(0)  # freeing the target would talk to the stopped workers
    """
)


def test_the_draft_model_stays_on_this_machine_when_the_target_is_split(
    home: Path, two_workers: tuple[Worker, Worker]
) -> None:
    require_model(SMOLLM2_KEY)
    path = models_dir() / SMOLLM2_FILE
    addresses = ",".join(worker.address for worker in two_workers)
    child = subprocess.Popen(
        [sys.executable, "-c", DRAFT_STAYS_LOCAL, str(path), addresses],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    placements = child.stdout.readline()
    assert placements.startswith("placements 10 layers on this CPU") and "| this machine" in (
        placements
    )
    for worker in two_workers:
        worker.process.kill()
        worker.process.wait()
    child.stdin.write("go\n")
    child.stdin.flush()
    # With the workers gone, a draft that used them would abort; this one decodes.
    drafted = child.stdout.readline()
    assert child.wait(60) == 0, drafted
    assert drafted.startswith("draft [") and len(drafted.split(",")) == 8


def long_turn() -> ChatTurn:
    return ChatTurn(
        PAIR,
        (ChatMessage("user", COUNT_PROMPT),),
        SamplingParams(temperature=0.0),
        max_tokens=400,
        drafter="none",
    )


def crash_mid_reply(
    client: EngineClient, fault: Callable[[], None]
) -> tuple[str, EngineRuntimeRestartedError, float]:
    """A long reply on ``client``, ``fault`` done once five pieces of it came: the text
    that came, the error that ended the reply (the engine's runtime died with the
    worker; the engine stays), and the seconds from the fault to it."""
    received: list[str] = []
    faulted_at = 0.0
    with pytest.raises(EngineRuntimeRestartedError) as caught:
        for item in client.chat(long_turn()):
            if isinstance(item, GenerationEvent) and item.text:
                received.append(item.text)
                if len(received) == 5:
                    fault()
                    faulted_at = time.monotonic()
    return "".join(received), caught.value, time.monotonic() - faulted_at


def test_a_worker_killed_mid_reply_is_named_and_the_pair_loads_again_without_it(
    home: Path, two_workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    require_model(SMOLLM2_KEY)
    first, second = two_workers
    monkeypatch.setenv("DRAFTPEN_HOME", str(home))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(models_dir()))
    crash_report.forget_crashes()
    socket_path = short_socket("killed")
    workers = f"{first.address},{second.address}"
    options = ["--keep-alive", "-1", "--workers", workers]
    client = ensure_engine(Settings(), socket_path=socket_path, serve_options=options)
    try:
        engine_pid = client.health().pid
        received, crash, _ = crash_mid_reply(client, second.process.kill)
        assert received.strip(), "the reply had begun"
        message = str(crash)
        assert message.startswith("The engine's runtime restarted: ")
        assert f"Worker {second.address} stopped answering" in message
        assert first.address not in message  # the worker still running is not blamed
        assert "draftpen worker" in message and "without" in message

        # The engine stayed and started its runtime again; the next load names the
        # worker that is gone, and loads the pair with the worker left.
        assert client.health().pid == engine_pid
        with pytest.raises(EngineRequestError) as refused:
            client.load(PAIR)  # the engine's own workers: one is gone, said by name
        assert f"Worker {second.address} cannot be reached" in str(refused.value)
        with pytest.raises(EngineRequestError, match="A worker is HOST:PORT"):
            client.load(PAIR, workers=["gpu-box:port"])
        loaded = client.load(PAIR, workers=[first.address])
        assert loaded.target_placement is not None and first.address in loaded.target_placement
        assert second.address not in loaded.target_placement
        text = "".join(
            item.text
            for item in client.chat(
                ChatTurn(
                    PAIR,
                    (ChatMessage("user", "Say hello."),),
                    SamplingParams(temperature=0.0),
                    max_tokens=8,
                )
            )
            if isinstance(item, GenerationEvent)
        )
        assert text.strip()
        assert client.load(PAIR, workers=[]).target_placement == "this machine"
    finally:
        stop_engine(client)
        crash_report.forget_crashes()


@dataclass
class Namespace:
    """A network namespace joined to this one by a veth pair: another machine, as far
    as TCP can tell. Its end of the link can be cut to make that machine vanish."""

    name: str
    inside: str  # the veth end in the namespace
    address: str

    def run(self, *command: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.name, *command], check=True)


@pytest.fixture
def other_machine() -> Iterator[Namespace]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    tag = f"{os.getpid() % 100000}"
    name, outside, inside = f"dpw{tag}", f"dpo{tag}", f"dpi{tag}"
    subnet = f"10.{77 + os.getpid() % 100}.{os.getpid() % 250}"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", outside, "type", "veth", "peer", "name", inside],
        ["ip", "link", "set", inside, "netns", name],
        ["ip", "addr", "add", f"{subnet}.1/24", "dev", outside],
        ["ip", "link", "set", outside, "up"],
        ["ip", "netns", "exec", name, "ip", "addr", "add", f"{subnet}.2/24", "dev", inside],
        ["ip", "netns", "exec", name, "ip", "link", "set", inside, "up"],
        ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield Namespace(name, inside, f"{subnet}.2")
    finally:
        subprocess.run(["ip", "link", "del", outside], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_worker_machine_that_vanishes_mid_reply_ends_the_wait_and_is_named(
    home: Path, other_machine: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its link cut, the worker closes nothing: without keepalive the engine would wait
    for its answer forever (tried: still waiting after 100 s)."""
    require_model(SMOLLM2_KEY)
    port = free_port()
    log = home / "vanishing-worker.log"
    with log.open("w") as output:
        worker = subprocess.Popen(
            [
                *("ip", "netns", "exec", other_machine.name, *WORKER_COMMAND),
                *("--host", other_machine.address, "--port", str(port)),
                *("--threads", "1", "--allow-network"),
            ],
            cwd=REPO,
            env={**os.environ, "DRAFTPEN_HOME": str(home)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    endpoint = Endpoint(other_machine.address, port)
    monkeypatch.setenv("DRAFTPEN_HOME", str(home))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(models_dir()))
    crash_report.forget_crashes()
    socket_path = short_socket("vanish")
    client = None
    try:
        deadline = time.monotonic() + 60
        while unreachable(endpoint) is not None:
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        options = ["--keep-alive", "-1", "--workers", str(endpoint)]
        client = ensure_engine(Settings(), socket_path=socket_path, serve_options=options)
        _, crash, waited = crash_mid_reply(
            client, lambda: other_machine.run("ip", "link", "set", other_machine.inside, "down")
        )
        assert f"Worker {endpoint} stopped answering" in str(crash)
        # keepalive.USER_TIMEOUT_MS (data in flight) or keepalive's probes, plus slack.
        assert waited < 60, f"the engine waited {waited:.0f} s for a vanished worker"
    finally:
        worker.kill()
        worker.wait()
        if client is not None:
            stop_engine(client)
        crash_report.forget_crashes()


def test_a_worker_that_hangs_mid_reply_is_named_within_the_timeout_and_loads_again_without_it(
    home: Path, two_workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped worker's kernel still acknowledges TCP, so keepalive never gives up on
    it: the watchdog breaks its connection once it has been silent past the bound."""
    require_model(SMOLLM2_KEY)
    first, second = two_workers
    monkeypatch.setenv("DRAFTPEN_HOME", str(home))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(models_dir()))
    crash_report.forget_crashes()
    socket_path = short_socket("hung")
    timeout = 3.0  # the floor (worker_timeout)
    options = ["--keep-alive", "-1", "--workers", f"{first.address},{second.address}"]
    options += ["--worker-timeout", str(timeout)]
    client = ensure_engine(Settings(), socket_path=socket_path, serve_options=options)
    try:
        received, crash, waited = crash_mid_reply(
            client, lambda: second.process.send_signal(signal.SIGSTOP)
        )
        assert received.strip(), "the reply had begun"
        message = str(crash)
        assert message.startswith("The engine's runtime restarted: ")
        assert f"Worker {second.address} stopped answering" in message
        assert "did not answer for" in message and first.address not in message
        # The bound: at least the floor, more where this machine's recent forward passes
        # were slow (on 2 busy cores a decode here takes up to ~1.5 s: 15 s).
        said = re.findall(
            r"breaking its connection \(waited \S+ s, bound (\S+) s, a call",
            (engine_log_path().read_text()),
        )
        assert said, "the watchdog's line is in the engine's log"
        bound = float(said[-1])
        # Then a tick of the watchdog, the abort and the crash report's reading.
        assert timeout <= bound <= waited < bound + 8, f"named after {waited:.1f} s"

        loaded = client.load(PAIR, workers=[first.address])
        assert loaded.target_placement is not None and second.address not in (
            loaded.target_placement
        )
        turn = ChatTurn(
            PAIR, (ChatMessage("user", "Say hello."),), SamplingParams(temperature=0.0), 8
        )
        assert "".join(i.text for i in client.chat(turn) if isinstance(i, GenerationEvent))
    finally:
        second.process.send_signal(signal.SIGCONT)
        stop_engine(client)
        crash_report.forget_crashes()
