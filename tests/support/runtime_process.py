"""An engine whose runtime runs in a process of its own, over scripted models, for fast
tests of the front and its runtime: the real :class:`~app.engine.runner.AgentServer`
with a :class:`~app.engine.runtime_wire.RuntimeSpec`, so the runtime is a real spawned
process that a test can kill; only the models are scripted (and slowed down, so a
reply is still being written when the test kills it).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from app.client import EngineClient
from app.engine.runner import AgentServer
from app.engine.runtime_deaths import CrashWindow
from app.engine.runtime_wire import RuntimeSpec
from app.engine.scheduler import LoadOptions, PairScheduler
from app.settings import Settings
from backends.engine import Engine
from tests.support.byte_model import ScriptedByteModel
from tests.support.engine_fixtures import ScriptedPairs
from tests.support.scripted_tools import HermesScriptedModel

LONG_REPLY = "The runtime writes this reply slowly, one byte a step, for the test. " * 3


@dataclass(frozen=True)
class ScriptedRuntime:
    """How the runtime process's scripted pairs behave (picklable: it crosses)."""

    reply: str = LONG_REPLY
    token_seconds: float = 0.0  # a pause in every forward pass, to be killed mid-reply
    die_on_load: bool = False  # the runtime kills itself (SIGKILL) as it loads a pair
    tools: bool = False  # a model behind a Hermes-style template that takes tools


class SlowByteModel(ScriptedByteModel):
    """A scripted model that pauses in every forward pass."""

    def __init__(self, replies: Sequence[str], *, pause: float, **kwargs: object) -> None:
        super().__init__(replies, **kwargs)  # type: ignore[arg-type]
        self.pause = pause

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        time.sleep(self.pause)
        return super().forward(tokens, last_only=last_only)


def build_scripted_runtime(spec: RuntimeSpec) -> PairScheduler:
    """In the runtime process: a scheduler whose pairs are scripted models."""
    setup: ScriptedRuntime = spec.setup

    def load(name: str, options: LoadOptions, report: Callable[[str], None]) -> Engine:
        report(f"reading {name}")
        if setup.die_on_load:
            os.kill(os.getpid(), signal.SIGKILL)
        if setup.tools:
            hermes = HermesScriptedModel([setup.reply], name=f"{name}-target")
            return Engine(hermes)
        model = SlowByteModel(
            [setup.reply],
            pause=setup.token_seconds,
            name=f"{name}-target",
            n_ctx=options.context_length,
        )
        return Engine(model)

    return PairScheduler(load, spec.defaults, keep_alive=spec.keep_alive)


@dataclass
class RuntimeEngine:
    """A running engine with its runtime in a process, and how to reach it."""

    server: AgentServer
    socket_path: Path

    def client(self) -> EngineClient:
        """draftpen's own client."""
        return EngineClient(self.socket_path)

    def http(self) -> httpx.Client:
        """httpx on the socket."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return httpx.Client(transport=transport, base_url="http://draftpen", timeout=60)

    def runtime_pid(self) -> int:
        """The runtime process's pid, as ``/health`` says."""
        runtime = self.client().health().runtime
        assert runtime is not None and runtime.pid is not None
        return runtime.pid


@contextmanager
def runtime_engine(
    tmp_path: Path,
    setup: ScriptedRuntime,
    *,
    names: Sequence[str] = ("alpha",),
    preload: str | None = None,
    crashes: CrashWindow | None = None,
    queue_limit: int = 16,
) -> Iterator[RuntimeEngine]:
    """An engine on a socket in ``tmp_path`` whose runtime is a process of scripted
    pairs; stopped on exit."""
    path = tmp_path / "engine.sock"
    defaults = LoadOptions(4096, False)
    spec = RuntimeSpec(
        build=build_scripted_runtime,
        defaults=defaults,
        setup=setup,
        preload=(preload, defaults) if preload else None,
        record_path=path.with_name("engine.sock.runtime"),
    )
    server = AgentServer(
        socket_path=path,
        settings=Settings(drafter="none", temperature=0.0),
        runtime=spec,
        pairs=ScriptedPairs(names),
        queue_limit=queue_limit,
        configure_logging=False,
        runtime_crashes=crashes,
    )
    listening = threading.Event()
    thread = threading.Thread(target=server.run, kwargs={"announce": lambda _: listening.set()})
    thread.start()
    try:
        assert listening.wait(60), "the engine did not start listening"
        yield RuntimeEngine(server, path)
    finally:
        server.stop()
        thread.join(30)
        assert not thread.is_alive(), "the engine did not stop"


def chat_body(pair: str = "alpha", **fields: object) -> dict[str, object]:
    """A streamed chat request for a scripted pair."""
    return {
        "model": pair,
        "messages": [{"role": "user", "content": "Write the reply."}],
        "stream": True,
        "temperature": 0,
        **fields,
    }
