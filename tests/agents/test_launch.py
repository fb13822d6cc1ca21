"""``draftpen launch``: the settings each agent CLI gets, the engine it finds or starts.

The settings are checked as data, and where the CLI is installed, by the CLI itself:
opencode resolves (and validates) the config launch gives it, and ``codex doctor``
loads launch's overrides and reaches a real engine on TCP with the key. The engine
tests start real ``draftpen serve`` processes (SmolLM2, a small context) in a private
``DRAFTPEN_HOME``. The end-to-end runs of the CLIs are in test_agent_clis.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from app.cli.agent_settings import AGENTS, Endpoint, LaunchPlan, agent_plan
from app.cli.launch import EXIT_NOT_INSTALLED, prepare_engine, run_cli, split_arguments
from app.client import find_engine
from app.engine.runner import AgentServer
from app.engine.scheduler import LoadOptions, PairScheduler
from app.errors import DraftpenError
from app.settings import Settings
from backends.engine import Engine
from tests.engine.tcp_engine import KEY, tcp_engine
from tests.support.draftpen_cli import REPO
from tests.support.engine_fixtures import ScriptedPairs
from tests.support.model_files import SMOLLM2_KEY, require_model

ENDPOINT = Endpoint("http://127.0.0.1:8123", "the-key", "starter", 16384)
USER_ENV = {"PATH": "/usr/bin", "ANTHROPIC_API_KEY": "sk-ant-real", "HOME": "/home/someone"}


# -- arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            ["--pair", "starter", "--", "run", "What is 2+3?"],
            ("starter", None, ["run", "What is 2+3?"]),
        ),
        (["--context=8192", "--", "-p", "--model", "x"], (None, 8192, ["-p", "--model", "x"])),
        (["exec", "--pair", "x"], (None, None, ["exec", "--pair", "x"])),  # the CLI's own
        (["--pair", "p", "exec", "hi"], ("p", None, ["exec", "hi"])),
        ([], (None, None, [])),
    ],
)
def test_launch_takes_its_options_and_passes_the_rest_unchanged(
    arguments: list[str], expected: tuple[str | None, int | None, list[str]]
):
    assert split_arguments(arguments) == expected


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--model", "x", "--", "run"], "before '--'"),
        (["--context", "lots", "--"], "number of tokens"),
        (["--pair"], "needs a value"),
    ],
)
def test_bad_launch_options_are_refused_naming_the_fix(arguments: list[str], message: str):
    with pytest.raises(DraftpenError, match=message):
        split_arguments(arguments)


# -- the settings each CLI gets -----------------------------------------------------


def test_claude_code_gets_the_engine_in_its_environment_and_its_arguments_unchanged():
    plan = agent_plan(AGENTS["claude"], "/bin/claude", ENDPOINT, ["-p", "hi"], USER_ENV)
    assert plan.command == ["/bin/claude", "-p", "hi"]
    env = plan.environment
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"  # Claude Code adds /v1
    assert env["ANTHROPIC_AUTH_TOKEN"] == "the-key"
    assert "ANTHROPIC_API_KEY" not in env  # the user's real key stays out of this run
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL"):
        assert env[name] == "starter"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    # A CPU reads Claude Code's prompt for minutes before its first event.
    assert int(env["API_TIMEOUT_MS"]) >= 30 * 60 * 1000
    assert int(env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"]) >= 30 * 60 * 1000
    assert env["HOME"] == "/home/someone" and USER_ENV["ANTHROPIC_API_KEY"] == "sk-ant-real"


def test_codex_gets_a_responses_provider_as_toml_overrides_before_the_users_arguments():
    plan = agent_plan(AGENTS["codex"], "/bin/codex", ENDPOINT, ["exec", "fix it"], USER_ENV)
    assert plan.command[0] == "/bin/codex" and plan.command[-2:] == ["exec", "fix it"]
    flags, overrides = plan.command[1:-2:2], plan.command[2:-2:2]
    assert set(flags) == {"-c"}
    # Each value is TOML, as codex parses it.
    config = {}
    for override in overrides:
        key, _, value = override.partition("=")
        config[key] = tomllib.loads(f"value = {value}")["value"]
    assert config["model_provider"] == "draftpen" and config["model"] == "starter"
    assert config["model_providers.draftpen.base_url"] == "http://127.0.0.1:8123/v1"
    assert config["model_providers.draftpen.wire_api"] == "responses"
    assert config["model_providers.draftpen.env_key"] == "DRAFTPEN_API_KEY"
    assert config["model_context_window"] == 16384
    assert plan.environment["DRAFTPEN_API_KEY"] == "the-key"


def test_opencode_gets_a_whole_config_for_this_run_in_its_environment():
    plan = agent_plan(AGENTS["opencode"], "/bin/opencode", ENDPOINT, ["run", "hi"], USER_ENV)
    assert plan.command == ["/bin/opencode", "run", "hi"]
    config = json.loads(plan.environment["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["draftpen"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:8123/v1"
    assert provider["options"]["apiKey"] == "the-key"
    assert provider["models"]["starter"]["limit"]["context"] == 16384
    # Minutes of silence while a CPU reads the prompt do not make opencode give up.
    for timeout in ("timeout", "headerTimeout", "chunkTimeout"):
        assert provider["options"][timeout] >= 30 * 60 * 1000
    assert config["model"] == config["small_model"] == "draftpen/starter"


def cli_home(tmp_path: Path) -> dict[str, str]:
    """An environment whose home and XDG directories are under ``tmp_path``."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "OPENCODE"))},
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local/state"),
        "CODEX_HOME": str(home / ".codex"),
    }


@pytest.mark.skipif(shutil.which("opencode") is None, reason="opencode is not installed")
def test_opencode_itself_accepts_and_resolves_the_config_launch_gives_it(tmp_path: Path):
    opencode = shutil.which("opencode")
    assert opencode is not None
    env = cli_home(tmp_path)
    plan = agent_plan(AGENTS["opencode"], opencode, ENDPOINT, ["debug", "config"], env)
    result = subprocess.run(
        plan.command,
        env=plan.environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)
    assert resolved["model"] == "draftpen/starter"
    assert resolved["provider"]["draftpen"]["options"]["baseURL"] == "http://127.0.0.1:8123/v1"
    # Nothing was written into the user's config directory.
    assert not (Path(env["XDG_CONFIG_HOME"]) / "opencode" / "opencode.json").exists()


@pytest.mark.skipif(shutil.which("codex") is None, reason="Codex CLI is not installed")
def test_codex_doctor_loads_the_overrides_and_reaches_the_engine_with_the_key(tmp_path: Path):
    codex = shutil.which("codex")
    assert codex is not None
    env = cli_home(tmp_path)
    Path(env["CODEX_HOME"]).mkdir()
    with tcp_engine(tmp_path) as running:
        endpoint = Endpoint(running.url, KEY, "scripted", 4096)
        plan = agent_plan(AGENTS["codex"], codex, endpoint, ["doctor", "--json"], env)
        result = subprocess.run(
            plan.command,
            env=plan.environment,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    report = json.loads(result.stdout[result.stdout.index("{") :])
    checks = report["checks"]
    assert checks["config.load"]["status"] == "ok"
    assert checks["auth.credentials"]["details"]["provider auth env var"].startswith(
        "DRAFTPEN_API_KEY (present)"
    )
    reach = checks["network.provider_reachability"]
    assert reach["status"] == "ok", reach
    assert any("draftpen" in name for name in reach["details"])
    assert not (Path(env["CODEX_HOME"]) / "config.toml").exists()


# -- running the CLI ----------------------------------------------------------------


def test_a_cli_that_is_not_installed_gets_its_install_command_and_127(tmp_path: Path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "app.main", "launch", "codex", "--", "exec", "hi"],
        cwd=REPO,
        env={**os.environ, "PATH": str(empty), "DRAFTPEN_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == EXIT_NOT_INSTALLED
    assert "npm install -g @openai/codex" in result.stderr
    assert "no `codex` on PATH" in result.stderr
    assert not (tmp_path / "home" / "run").exists()  # no engine was started for nothing


def test_launch_exits_with_the_clis_status_and_128_plus_a_signal():
    python = [sys.executable, "-c"]
    # What the test process had (a job started in the background has SIGINT ignored).
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert run_cli(LaunchPlan([*python, "import sys; sys.exit(3)"], dict(os.environ))) == 3
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert run_cli(LaunchPlan([*python, killed], dict(os.environ))) == 128 + signal.SIGTERM
    # launch's own handlers are back once the CLI has ended.
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# -- finding or starting the engine -------------------------------------------------


@pytest.fixture
def launch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private DRAFTPEN_HOME; every engine started in it is stopped afterwards."""
    home = tmp_path / "dh"
    monkeypatch.setenv("DRAFTPEN_HOME", str(home))
    monkeypatch.delenv("DRAFTPEN_API_KEY", raising=False)
    monkeypatch.delenv("DRAFTPEN_SOCKET", raising=False)
    yield home
    for socket_path in (home / "run").glob("*.sock"):
        client = find_engine(socket_path)
        if client is not None and client.health().pid != os.getpid():
            os.kill(client.health().pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while socket_path.exists() and time.monotonic() < deadline:
                time.sleep(0.1)


@pytest.mark.real_model
def test_launch_starts_an_engine_on_tcp_with_the_key_loads_the_pair_and_finds_it_again(
    launch_home: Path,
):
    require_model(SMOLLM2_KEY)
    said: list[str] = []
    client, endpoint = prepare_engine("smollm2", 1024, report=said.append)
    key_file = launch_home / "config" / "api-key"
    assert endpoint.key == key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert endpoint.url.startswith("http://127.0.0.1:") and endpoint.context >= 1024
    assert client.socket_path == launch_home / "run" / "draftpen.sock"
    health = client.health()
    assert health.idle_exit and [loaded.pair for loaded in health.loaded] == ["smollm2"]
    with httpx.Client(base_url=endpoint.url) as http:
        assert http.get("/v1/models").status_code == 401
        keyed = http.get("/v1/models", headers={"Authorization": f"Bearer {endpoint.key}"})
        assert keyed.status_code == 200
    assert any("loading 'smollm2' with a 1024-token context" in line for line in said)

    again: list[str] = []
    _, second = prepare_engine("smollm2", 512, report=again.append)
    assert second.url == endpoint.url and second.context == endpoint.context
    assert client.health().loads == health.loads  # found, and nothing reloaded
    assert not any("Starting" in line or "loading" in line for line in again)


@pytest.mark.real_model
def test_an_engine_without_tcp_on_the_socket_gets_an_agents_engine_beside_it(launch_home: Path):
    require_model(SMOLLM2_KEY)
    run_dir = launch_home / "run"
    run_dir.mkdir(parents=True, mode=0o700)
    # The chat app's engine: on the default socket, no TCP (scripted, in this process).
    chat_engine = AgentServer(
        socket_path=run_dir / "draftpen.sock",
        settings=Settings(),
        scheduler=_no_loads(),
        pairs=ScriptedPairs(["alpha"]),
        configure_logging=False,
    )
    listening = threading.Event()
    thread = threading.Thread(
        target=chat_engine.run, kwargs={"announce": lambda _: listening.set()}
    )
    thread.start()
    try:
        assert listening.wait(10)
        said: list[str] = []
        client, endpoint = prepare_engine("smollm2", 512, report=said.append)
    finally:
        chat_engine.stop()
        thread.join(15)
    assert client.socket_path == run_dir / "agents.sock"
    assert any("does not listen on TCP" in line for line in said)
    with httpx.Client(base_url=endpoint.url, timeout=300) as http:
        answer = http.post(
            "/v1/chat/completions",
            headers={"x-api-key": endpoint.key},
            json={
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
            },
        )
    assert answer.status_code == 200, answer.text


def _no_loads() -> PairScheduler:
    """A scheduler that fails the test if it is ever asked to load a pair."""

    def load(name: str, options: LoadOptions, report: Callable[[str], None]) -> Engine:
        raise AssertionError(f"the chat app's engine was asked to load {name}")

    return PairScheduler(load, LoadOptions(4096, False))
