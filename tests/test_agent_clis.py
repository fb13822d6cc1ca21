"""The agent CLIs people run, as published on npm, answering through ``draftpen launch``.

Each test runs a real CLI (installed by the test setup: ``npm install -g
@anthropic-ai/claude-code @openai/codex opencode-ai``, see packaging/lib.sh) through
``draftpen launch AGENT --pair starter -- ARGS``, as a user would: launch finds or starts
an engine on TCP with its API key, loads the starter pair with a context the agent's
prompt fits in, and runs the CLI with its settings for this run only. The tests share
one private ``DRAFTPEN_HOME``, so the first launch starts the engine (and measures the
pair's forward costs once) and the others find it; each CLI has its own private home
and XDG directories, so nothing of the user's is read or written. They are slow on a
CPU (the agents' prompts are thousands of tokens: Claude Code's about 19k), so they
are marked ``agent_cli`` and can be run alone: ``pytest -m agent_cli``.

What the starter model (1.5B) answers is its own affair: sampled at the agent's own
temperature it may write "5", or call one of the agent's tools and end without a word
(CI once saw Claude Code print "Task #1 created successfully", and opencode run twice
its bash tool and print nothing). So no test asserts what the model wrote, not even
that it wrote anything. The tests assert what draftpen owes: the CLI finishes its
session without an error (it parsed every answer, streamed or not, tool calls
included), every request it sent was answered 200, and, where the CLI reports it, the
usage it read from our stream is the size of its prompt.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.client import find_engine
from tests.model_files import DRAFT_KEY, TARGET_KEY, require_model
from tests.test_cli_generate import REPO

# A CPU reads an agent's prompt for minutes; loading measures forward costs once.
CLI_SECONDS = 3000


@dataclass
class AgentsHome:
    """The private draftpen home the launches share, and where each CLI's home goes."""

    root: Path

    @property
    def draftpen(self) -> Path:
        return self.root / "draftpen"

    @property
    def engine_log(self) -> Path:
        return self.draftpen / "cache" / "engine.log"

    def requests(self, path: str) -> list[str]:
        """The engine log's lines for requests to ``path``."""
        if not self.engine_log.exists():
            return []
        return [line for line in self.engine_log.read_text().splitlines() if f"POST {path}" in line]


# The agents' homes and projects live at the same paths on every run, and the prompt
# prefixes the engine saved are kept from one run to the next (outside the clone, as
# the model store is): the CLIs write their home and working directory into their
# prompts, so fixed paths let a machine that ran these tests before load the agents'
# prompts instead of reading them for minutes (backends/caches/disk_prefixes.py).
AGENTS_ROOT = Path(
    os.environ.get("DRAFTPEN_TEST_AGENTS_DIR", Path.home() / ".cache" / "draftpen-test-agents")
)
KEPT = Path("draftpen") / "cache" / "prefixes"


# Claude Code's reply cap in these tests, and the words of its error when a reply hits it.
CLAUDE_MAX_OUTPUT_TOKENS = 512
CLAUDE_CAPPED = f"exceeded the {CLAUDE_MAX_OUTPUT_TOKENS} output token maximum"
# Claude Code's agent turns in these tests: a temperature-1 model that goes on calling
# tools and starting sub-agents (each with its own ~11k-token prompt to read) took
# ~15 minutes of CI once; two turns show it read draftpen's answers and acted on them.
CLAUDE_MAX_TURNS = 2


@pytest.fixture(scope="module")
def agents_home() -> Iterator[AgentsHome]:
    require_model(TARGET_KEY)
    require_model(DRAFT_KEY)
    home = AgentsHome(AGENTS_ROOT)
    fresh_agents_root(home.root)
    yield home
    stop_launched_engine(home.draftpen)


def fresh_agents_root(root: Path) -> None:
    """Empty ``root`` of everything an earlier run left but the saved prompt prefixes."""
    kept = root / KEPT
    parked = root.with_name(root.name + "-kept-prefixes")
    shutil.rmtree(parked, ignore_errors=True)
    if kept.is_dir():
        kept.rename(parked)
    shutil.rmtree(root, ignore_errors=True)
    kept.parent.mkdir(parents=True)
    if parked.is_dir():
        parked.rename(kept)


def private_environment(agents: AgentsHome, name: str) -> dict[str, str]:
    """The test's environment with draftpen's home shared and the CLI's own under ``name``."""
    home = agents.root / name / "home"
    home.mkdir(parents=True)
    skipped = ("XDG_", "OPENCODE", "ANTHROPIC_", "CODEX_", "DRAFTPEN_HOME", "DRAFTPEN_API_KEY")
    return {
        **{key: value for key, value in os.environ.items() if not key.startswith(skipped)},
        "DRAFTPEN_HOME": str(agents.draftpen),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local/state"),
        "PYTHONPATH": str(REPO),
    }


def stop_launched_engine(draftpen_home: Path) -> None:
    """Stop the engine launch started (it would stop itself once idle, minutes later)."""
    for socket_path in (draftpen_home / "run").glob("*.sock"):
        client = find_engine(socket_path)
        if client is None:
            continue
        os.kill(client.health().pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)


@dataclass
class Launched:
    """One ``draftpen launch`` run: its result, the project it ran in, and a report."""

    result: subprocess.CompletedProcess[str]
    project: Path
    report: str


def launch(agents: AgentsHome, agent: str, arguments: list[str]) -> Launched:
    """``draftpen launch AGENT --pair starter -- ARGUMENTS`` in a fresh project directory."""
    if shutil.which(agent) is None:
        # packaging/test.sh installs it (install_agent_clis); a run without it is no pass.
        pytest.fail(f"{agent} is not installed: run packaging/test.sh, or npm install it")
    env = private_environment(agents, agent)
    project = agents.root / agent / "project"
    project.mkdir()
    # opencode takes its working directory from $PWD, not from the process's own.
    env["PWD"] = str(project)
    if agent == "claude":
        # Claude Code asks for up to 32,000 tokens at temperature 1: a sampled reply
        # that rambles fills the context (~14k tokens, 15+ minutes on this CPU; seen
        # once). Its own setting bounds the reply as a user would; what the test
        # asserts does not depend on the reply's length.
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(CLAUDE_MAX_OUTPUT_TOKENS)
    command = [sys.executable, "-m", "app.main", "launch", agent, "--pair", "starter"]
    started = time.monotonic()
    result = subprocess.run(
        [*command, "--", *arguments],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_SECONDS,
        stdin=subprocess.DEVNULL,
    )
    log = agents.engine_log.read_text().splitlines() if agents.engine_log.exists() else []
    requests = [line for line in log if "/health" not in line]
    report = (
        f"launch took {time.monotonic() - started:.0f}s\nstdout:\n{result.stdout}\n"
        f"stderr:\n{result.stderr}\nengine log:\n" + "\n".join(requests[-20:])
    )
    return Launched(result, project, report)


def assert_all_answered(agents: AgentsHome, path: str, report: str) -> None:
    """The agent sent requests to ``path``, and each was answered 200."""
    requests = agents.requests(path)
    assert requests, report
    assert all("200 OK" in line for line in requests), report


@pytest.mark.real_model
@pytest.mark.agent_cli
def test_claude_code_answers_through_draftpen_launch(agents_home: AgentsHome):
    launched = launch(
        agents_home,
        "claude",
        ["-p", "What is 2+3?", "--output-format", "json", "--max-turns", str(CLAUDE_MAX_TURNS)],
    )
    try:
        outcome = json.loads(launched.result.stdout)
    except json.JSONDecodeError:
        pytest.fail(launched.report)
    # A sampled reply (temperature 1) that runs to the test's 512-token cap is cut there
    # by draftpen (stop reason max_tokens), and Claude Code reports that as its own error
    # and exits 1 (CI, once: four 512-token replies in a row). It read draftpen's answers,
    # which is what this test is about; any other error fails it.
    capped = outcome.get("is_error") is True and CLAUDE_CAPPED in str(outcome.get("result"))
    # A model that is still calling tools after the test's turns ends the same way
    # (subtype error_max_turns): it read and acted on draftpen's replies.
    out_of_turns = outcome.get("subtype") == "error_max_turns"
    if not (capped or out_of_turns):
        assert launched.result.returncode == 0, launched.report
        # Success, whatever the model answered ("result" may be empty after a tool call).
        assert outcome["is_error"] is False and outcome["subtype"] == "success", launched.report
    # Claude Code's system prompt and tools are ~19k tokens: a usage near zero would mean
    # it never read ours from message_start / message_delta.
    usage = outcome["usage"]
    read = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    assert read > 5000 and usage["output_tokens"] > 0, usage
    assert_all_answered(agents_home, "/v1/messages", launched.report)


@pytest.mark.real_model
@pytest.mark.agent_cli
def test_codex_answers_through_draftpen_launch(agents_home: AgentsHome):
    launched = launch(
        agents_home,
        "codex",
        ["exec", "--skip-git-repo-check", "What is 2+3? Answer with the number only."],
    )
    # codex exec prints the agent's last message on stdout: empty where the model ended
    # on a tool call, which is its choice. Exit 0 means codex read every response whole.
    assert launched.result.returncode == 0, launched.report
    assert_all_answered(agents_home, "/v1/responses", launched.report)


@pytest.mark.real_model
@pytest.mark.agent_cli
def test_opencode_answers_through_draftpen_launch(agents_home: AgentsHome):
    launched = launch(
        agents_home,
        "opencode",
        ["run", "What is 2+3? Answer with the number only."],
    )
    # opencode run prints the agent's answer on stdout, or nothing where the model ended
    # on a tool call (its bash tool, say): the model's choice, not the wire's.
    assert launched.result.returncode == 0, launched.report
    assert_all_answered(agents_home, "/v1/chat/completions", launched.report)
    # Its settings came for this run only: no config file was written for it.
    home = agents_home.root / "opencode" / "home"
    assert not any((home / ".config" / "opencode").glob("opencode.json*"))
    assert not (launched.project / "opencode.json").exists()
