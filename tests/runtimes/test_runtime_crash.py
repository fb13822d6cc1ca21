"""A runtime that crashes inside the engine: every front end says so, and none loops.

The engines here are real ``draftpen serve`` processes with SmolLM2, started as a front
end starts them (``ensure_engine``), whose runtime is made to crash for real by the
engine's test hook: ``DRAFTPEN_TEST_CRASH=decode:SIGSEGV:N`` kills the process with
SIGSEGV on its target's N-th forward pass (a reply has begun by then), ``load:SIGILL``
as it starts loading a pair. The process dies by the signal, as it would in
``ggml_backend_amx_mul_mat`` (issue 26); what the clients know of it they learn from
the record it left beside its socket (``app.client.crash_report``).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from app.chats.history import INTERRUPTED, History
from app.cli.repl import CRASHED_NOTE, PlainChat
from app.client import (
    ChatTurn,
    EngineClient,
    EngineCrashedError,
    EngineCrashLoopError,
    EngineLost,
    crash_report,
    engine_log_path,
    ensure_engine,
    starting,
)
from app.client.crash_report import (
    EngineCrash,
    activity_path,
    fatal_path,
    fatal_signal,
    read_crash,
)
from app.engine.crash_record import CrashRecorder, crash_test_hook
from app.errors import DraftpenError
from app.main import build_parser
from app.options import chat_settings
from app.settings import Settings
from app.tui.app import DraftpenApp
from backends.base import ChatMessage
from backends.generation_events import GenerationEvent
from backends.sampling.filters import SamplingParams
from tests.chat_app.test_cli_generate import REPO, run_draftpen
from tests.chat_app.test_tui_real import COUNT_PROMPT, StartedEngines, replies, wait_for
from tests.engine.test_engine_clients import pid_alive, sdk, short_socket, stop_engine
from tests.support.engine_fixtures import wait_until
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tui_helpers import FakeModelsService, run, send

PAIR = "smollm2"
# Late enough that the reply has reached the client, early enough that it is unfinished.
CRASH_ON_DECODE = "decode:SIGSEGV:12"
LONG_REPLY = 400


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DRAFTPEN_HOME for this module's engines (forward costs measured once)."""
    return tmp_path_factory.mktemp("crash-engine-home")


@pytest.fixture
def engine_home(shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared home, for this test and the engines it starts."""
    monkeypatch.setenv("DRAFTPEN_HOME", str(shared_home))
    return shared_home


@pytest.fixture(autouse=True)
def fresh_front_end() -> Iterator[None]:
    """Each test is a new front-end session: no crash seen yet."""
    crash_report.forget_crashes()
    yield
    crash_report.forget_crashes()


@pytest.fixture
def socket_path(engine_home: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """This test's engine socket; whatever engine still runs there is stopped after."""
    require_model(SMOLLM2_KEY)
    path = short_socket(request.node.name[:36])
    try:
        yield path
    finally:
        stop_engine(EngineClient(path))


@pytest.fixture
def engine_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pid of every engine process a front end starts during the test."""
    pids: list[int] = []
    start = starting._start_engine

    def counted(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        process = start(*args, **kwargs)  # type: ignore[arg-type]
        pids.append(process.pid)
        return process

    monkeypatch.setattr(starting, "_start_engine", counted)
    return pids


def long_turn() -> ChatTurn:
    return ChatTurn(
        PAIR,
        (ChatMessage("user", COUNT_PROMPT),),
        SamplingParams(temperature=0.0),
        max_tokens=LONG_REPLY,
        drafter="none",
    )


def start_engine(socket_path: Path) -> EngineClient:
    return ensure_engine(Settings(), socket_path=socket_path, serve_options=["--keep-alive", "-1"])


# -- through the real client: the signal, the pair, the fix ---------------------------


@pytest.mark.real_model
def test_a_runtime_crash_mid_reply_names_the_signal_the_pair_and_doctor_and_keeps_the_text(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", CRASH_ON_DECODE)
    client = start_engine(socket_path)
    pid = client.health().pid
    received: list[str] = []
    with pytest.raises(EngineCrashedError) as caught:
        for item in client.chat(long_turn()):
            if isinstance(item, GenerationEvent):
                received.append(item.text)
    crash = caught.value
    assert isinstance(crash, EngineLost)  # every front end's EngineLost path keeps the text
    assert (crash.signal_name, crash.doing, crash.pair) == ("SIGSEGV", "generating", PAIR)
    message = str(crash)
    assert "llama.cpp runtime crashed (SIGSEGV" in message
    assert f"while generating with pair '{PAIR}'" in message
    assert "Run `draftpen doctor`" in message and not crash.gives_up
    assert "".join(received).strip(), "the reply had begun before the crash"
    engine_process = crash_report.started_process(socket_path)
    assert engine_process is not None and engine_process.pid == pid
    assert engine_process.wait(60) == -signal.SIGSEGV  # it died by the signal, for real
    # The engine's own record: faulthandler's words, under this engine's pid.
    record = fatal_path(socket_path).read_text()
    assert f"draftpen engine pid {pid}" in record
    assert "Fatal Python error: Segmentation fault" in record


@pytest.mark.real_model
def test_a_runtime_crash_while_loading_names_the_pair_and_the_likely_cause(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "load:SIGILL")
    client = start_engine(socket_path)
    with pytest.raises(EngineCrashedError) as caught:
        client.load(PAIR)
    crash = caught.value
    assert (crash.signal_name, crash.doing, crash.pair) == ("SIGILL", "loading", PAIR)
    assert f"while loading pair '{PAIR}'" in str(crash)
    assert "built for another CPU" in str(crash) and "draftpen doctor" in str(crash)


@pytest.mark.real_model
def test_a_crashing_engine_is_started_once_more_then_not_at_all(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, engine_starts: list[int]
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", CRASH_ON_DECODE)
    first = start_engine(socket_path)
    assert first.health().previous_crash is None  # a new socket: no engine before it

    # An OpenAI SDK client sees only its stream cut: the engine that could say more
    # is the process that died (the runtime runs inside it).
    with pytest.raises((openai.APIConnectionError, httpx.TransportError)):
        stream = sdk(first).chat.completions.create(
            model=PAIR,
            messages=[{"role": "user", "content": COUNT_PROMPT}],
            temperature=0,
            max_tokens=LONG_REPLY,
            stream=True,
        )
        for _ in stream:
            pass
    # draftpen's client, asking next, learns why from the record the engine left.
    with pytest.raises(EngineCrashedError) as caught:
        first.health()
    assert caught.value.signal_name == "SIGSEGV" and not caught.value.gives_up

    # One restart; the new engine's log says what became of the one before.
    logged_before = engine_log_path().stat().st_size
    second = start_engine(socket_path)
    assert len(engine_starts) == 2
    with engine_log_path().open("rb") as log:
        log.seek(logged_before)
        new_lines = log.read().decode(errors="replace")
    assert "the previous engine on this socket died: The llama.cpp runtime crashed" in new_lines
    assert "Fatal Python error: Segmentation fault" in new_lines  # its record, for bug reports
    # An API client whose stream was cut asks the new engine's /health why.
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path))) as http:
        health = http.get("http://draftpen/health").json()
    previous = health["previous_crash"]
    assert (previous["signal"], previous["doing"], previous["pair"]) == (
        "SIGSEGV",
        "generating",
        PAIR,
    )
    assert "draftpen doctor" in previous["message"]
    assert second.health().previous_crash is not None
    with pytest.raises(EngineCrashedError) as caught:
        list(second.chat(long_turn()))
    assert caught.value.gives_up and "crashed twice" in str(caught.value)

    # No third engine, now or when asked again; the refusal says why and what to run.
    for _ in range(2):
        with pytest.raises(EngineCrashLoopError) as refused:
            start_engine(socket_path)
        assert "crashed twice" in str(refused.value) and "draftpen doctor" in str(refused.value)
    assert len(engine_starts) == 2
    for pid in engine_starts:
        wait_until(lambda pid=pid: not pid_alive(pid), f"engine {pid} to be gone", 60)


# -- the front ends ---------------------------------------------------------------


@pytest.mark.real_model
def test_generate_with_engine_exits_non_zero_naming_the_crash_after_the_partial_answer(
    socket_path: Path,
) -> None:
    result = run_draftpen(
        "generate",
        "--engine",
        "--pair",
        PAIR,
        "--temperature",
        "0",
        "--drafter",
        "none",
        "--max-tokens",
        str(LONG_REPLY),
        "--prompt",
        COUNT_PROMPT,
        env={"DRAFTPEN_SOCKET": str(socket_path), "DRAFTPEN_TEST_CRASH": CRASH_ON_DECODE},
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("draftpen: The llama.cpp runtime crashed (SIGSEGV"), last
    assert f"pair '{PAIR}'" in last and "draftpen doctor" in last
    assert result.stdout.strip() and result.stdout.endswith("\n")  # the answer so far


# An agent CLI stand-in for launch: it reads the settings launch gives opencode, streams
# one chat completion, and says how that ended; then it lingers, as an agent would.
FAKE_OPENCODE = """#!{python}
import json, os, sys, time
import httpx
config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
options = config["provider"]["draftpen"]["options"]
body = {{
    "model": config["model"].split("/", 1)[1],
    "messages": [{{"role": "user", "content": {prompt!r}}}],
    "max_tokens": {tokens}, "temperature": 0, "stream": True,
}}
headers = {{"Authorization": "Bearer " + options["apiKey"]}}
url = options["baseURL"] + "/chat/completions"
try:
    with httpx.stream("POST", url, json=body, headers=headers, timeout=300) as answer:
        for _ in answer.iter_lines():
            pass
    print("fake agent: the reply finished", flush=True)
except httpx.HTTPError as error:
    print("fake agent: connection lost:", type(error).__name__, flush=True)
time.sleep(5)
print("fake agent: exiting", flush=True)
sys.exit(1)
"""


@pytest.mark.real_model
def test_launch_tells_the_user_the_engine_crashed_while_the_agent_ran(
    engine_home: Path, tmp_path: Path
) -> None:
    require_model(SMOLLM2_KEY)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cli = bin_dir / "opencode"
    cli.write_text(
        FAKE_OPENCODE.format(python=sys.executable, prompt=COUNT_PROMPT, tokens=LONG_REPLY)
    )
    cli.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "DRAFTPEN_TEST_CRASH": CRASH_ON_DECODE,
        "DRAFTPEN_SOCKET": str(short_socket("launch-crash")),
    }
    env.pop("DRAFTPEN_API_KEY", None)
    result = subprocess.run(
        [sys.executable, "-m", "app.main", "launch", "opencode", "--pair", PAIR],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream: the order says when launch spoke
        text=True,
        timeout=600,
    )
    out = result.stdout
    assert result.returncode == 1, out[-3000:]  # the CLI's own status
    assert "fake agent: connection lost" in out, out[-3000:]
    assert "Traceback" not in out
    # While the agent still ran: the signal, the pair, the fix.
    said = out.index("The llama.cpp runtime crashed (SIGSEGV")
    line = out[said:].splitlines()[0]
    assert f"while generating with pair '{PAIR}'" in line and "draftpen doctor" in line
    assert "opencode cannot reach it until you launch it again" in line
    assert said < out.index("fake agent: exiting")
    # And once more after it, where a full-screen CLI cannot have drawn over it.
    last = out.strip().splitlines()[-1]
    assert last.startswith("draftpen launch: the engine went away during this session: ")
    assert "runtime crashed (SIGSEGV" in last


@pytest.mark.real_model
def test_plain_chat_keeps_each_partial_reply_restarts_once_then_stops_saying_why(
    socket_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    engine_starts: list[int],
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", CRASH_ON_DECODE)
    monkeypatch.setenv("DRAFTPEN_SOCKET", str(socket_path))
    args = build_parser().parse_args(
        [
            "chat",
            "--plain",
            "--pair",
            PAIR,
            "--temperature",
            "0",
            "--drafter",
            "none",
            "--max-tokens",
            str(LONG_REPLY),
        ]
    )
    # Typed ahead: each line is read once the reply before it has ended. A new chat for
    # the second count: after its own cut-off count the model answers briefly.
    typed = f"{COUNT_PROMPT}\n/new\n{COUNT_PROMPT}\n/exit\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    chat = PlainChat(args, chat_settings(args))
    assert chat.run() == 1  # the second crash ends the chat instead of a third engine
    out, err = capsys.readouterr()
    assert err.count(CRASHED_NOTE) == 2
    assert err.count("The llama.cpp runtime crashed (SIGSEGV") == 2
    assert err.count("What it wrote is kept in the chat.") == 2
    assert err.count("starting the engine again") == 1
    assert "crashed twice, so draftpen does not start it again" in err
    assert len(engine_starts) == 2
    # Both counts were on the screen as far as they went (after the "> " prompt), and
    # the chat holds the second.
    shown = [line.removeprefix("> ") for line in out.splitlines() if line.startswith("> ")]
    counts = [text for text in shown if text.strip()]
    assert len(counts) == 2
    assert [message.role for message in chat.messages] == ["user", "assistant"]
    assert chat.messages[1].content == counts[1]


@pytest.mark.real_model
def test_the_chat_app_keeps_the_reply_as_interrupted_restarts_once_then_stops_saying_why(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine_starts: list[int]
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", CRASH_ON_DECODE)
    engines = StartedEngines(socket_path)
    settings = Settings(default_pair=PAIR, temperature=0.0, max_tokens=LONG_REPLY, drafter="none")
    app = DraftpenApp(
        connect=engines.connect,
        models_service=FakeModelsService,
        history=History(tmp_path / "history.sqlite3"),
        settings=settings,
        pair_name=PAIR,
    )

    def notices() -> list[tuple[str, str]]:
        return [(str(n.title), n.message) for n in app._notifications]

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready, "the pair to load", 180)

            # The first crash: the reply is kept, marked, said; the engine starts again.
            await send(pilot, COUNT_PROMPT)
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the crash", 120)
            crashed = replies(app)[-1]
            assert "interrupted: the runtime crashed" in str(crashed.query_one(".heading").render())
            stored = app.history.messages(app.chat_screen.chat_id)
            assert stored[-1].state == INTERRUPTED
            assert stored[-1].content.strip() and stored[-1].content == crashed.content
            [text] = [text for title, text in notices() if title == "The runtime crashed mid-reply"]
            assert "(SIGSEGV" in text and f"pair '{PAIR}'" in text and "draftpen doctor" in text
            await wait_for(pilot, lambda: app.ready, "the one restart", 180)
            assert len(engine_starts) == 2

            # The second crash (in a new chat: after its own cut-off count the model
            # answers briefly): kept the same way, and the app stops, saying why.
            first_chat = app.chat_screen.chat_id
            await pilot.press("ctrl+n")
            await send(pilot, COUNT_PROMPT)
            await wait_for(pilot, lambda: app.chat_screen.reply is None, "the crash", 120)
            await app.workers.wait_for_complete()
            for chat_id in (first_chat, app.chat_screen.chat_id):
                stored = app.history.messages(chat_id)
                assert [m.state for m in stored if m.role == "assistant"] == [INTERRUPTED]
            assert stored[-1].content.strip() and stored[-1].content == replies(app)[-1].content
            assert not app.ready and "crashed twice" in app.engine_status
            assert "draftpen doctor" in app.engine_status

            # Sending or loading again starts nothing: the app repeats why.
            await send(pilot, "Name three colours.")
            app.load_pair(PAIR)
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert "crashed twice" in app.engine_status and not app.ready
            assert len(engine_starts) == 2

    run(body)


@pytest.mark.real_model
def test_the_chat_app_whose_engine_crashes_loading_retries_once_then_says_why(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine_starts: list[int]
) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "load:SIGSEGV")
    engines = StartedEngines(socket_path)
    app = DraftpenApp(
        connect=engines.connect,
        models_service=FakeModelsService,
        history=History(tmp_path / "history.sqlite3"),
        settings=Settings(default_pair=PAIR),
        pair_name=PAIR,
    )

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: "Cannot load" in app.engine_status, "the failure", 180)
            await app.workers.wait_for_complete()
            status = app.engine_status
            assert f"while loading pair '{PAIR}'" in status and "(SIGSEGV" in status
            assert "crashed twice" in status and "draftpen doctor" in status
            assert len(engine_starts) == 2 and not app.ready

    run(body)


# -- the record itself, without an engine -----------------------------------------


def test_faulthandlers_words_name_the_signal() -> None:
    assert fatal_signal("Fatal Python error: Segmentation fault\n\nThread 0x1") == "SIGSEGV"
    assert fatal_signal("x\nFatal Python error: Illegal instruction\n") == "SIGILL"
    assert fatal_signal("Fatal Python error: Aborted\n") == "SIGABRT"
    assert fatal_signal("Fatal Python error: Bus error\n") == "SIGBUS"
    assert fatal_signal("Fatal Python error: Floating-point exception\n") == "SIGFPE"
    assert fatal_signal("draftpen engine pid 12 started\n") is None


def test_a_record_of_a_clean_stop_or_of_another_engine_is_no_crash(tmp_path: Path) -> None:
    socket_path = tmp_path / "engine.sock"
    recorder = CrashRecorder(socket_path, "llamacpp")
    recorder.note("generating", PAIR)
    pid = os.getpid()
    fatal_path(socket_path).write_text(
        f"draftpen engine pid {pid} started\nFatal Python error: Segmentation fault\n"
    )
    crash = read_crash(socket_path)
    assert crash is not None and (crash.pid, crash.signal_name, crash.pair) == (
        pid,
        "SIGSEGV",
        PAIR,
    )
    assert read_crash(socket_path, pid=pid + 1) is None  # a client of another engine
    # A record whose fatal file belongs to another process says nothing.
    fatal_path(socket_path).write_text(
        "draftpen engine pid 1 started\nFatal Python error: Aborted\n"
    )
    assert read_crash(socket_path) is None
    recorder.note("stopped")
    assert json.loads(activity_path(socket_path).read_text())["doing"] == "stopped"
    assert read_crash(socket_path) is None


def test_each_crashed_engine_counts_once_toward_the_one_restart(tmp_path: Path) -> None:
    socket_path = tmp_path / "engine.sock"
    crash = EngineCrash("SIGSEGV", pid=10, doing="generating", pair=PAIR)
    assert crash_report.remember_crash(socket_path, crash) == 1
    assert crash_report.remember_crash(socket_path, crash) == 1  # seen by a second client
    crash_report.refuse_after_crashes(socket_path)  # one crash: a restart is fine
    again = EngineCrash("SIGSEGV", pid=11, doing="generating", pair=PAIR)
    assert crash_report.remember_crash(socket_path, again) == 2
    with pytest.raises(EngineCrashLoopError, match="crashed twice"):
        crash_report.refuse_after_crashes(socket_path)
    crash_report.refuse_after_crashes(tmp_path / "other.sock")  # another engine's socket


def test_the_test_hook_reads_its_point_signal_and_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "decode:SIGSEGV:3")
    hook = crash_test_hook()
    assert hook is not None and (hook.point, hook.signal_name, hook.forward) == (
        "decode",
        "SIGSEGV",
        3,
    )
    monkeypatch.setenv("DRAFTPEN_TEST_CRASH", "decode:SIGNOPE")
    with pytest.raises(DraftpenError, match="DRAFTPEN_TEST_CRASH wants"):
        crash_test_hook()
    monkeypatch.delenv("DRAFTPEN_TEST_CRASH")
    assert crash_test_hook() is None
