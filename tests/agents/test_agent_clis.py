"""The agent CLIs people run, as published on npm, answering through ``draftpen launch``.

Each test runs a real CLI (installed by the test setup: ``npm install -g
@anthropic-ai/claude-code @openai/codex opencode-ai``, see packaging/lib.sh) through
``draftpen launch AGENT --pair PAIR -- ARGS``, as a user would: launch finds or starts
an engine on TCP with its API key, loads the pair with a context the agent's prompt
fits in, and runs the CLI with its settings for this run only. The tests share one
private ``DRAFTPEN_HOME``, so the first launch starts the engine and the others find
it; each CLI has its own private home and XDG directories, so nothing of the user's is
read or written. They are marked ``agent_cli`` and can be run alone: ``pytest -m
agent_cli``.

They prove the wire, not the model, so they run where a CPU reads an agent's prompt in
a minute (issue 53 part 7): on ``agents-small``, a pair of the test's own (the starter's
0.5B model as a target alone, added with ``draftpen models add`` as a user would), each
CLI with the smaller prompt its own settings give (Claude Code's ``--bare`` with one
tool, Codex's ``model_instructions_file``, opencode's ``tools`` and agent prompt: 0.6k,
2.5k and 1.5k tokens where the defaults are 18.8k, 6.0k and 7.2k; the tools they keep
are still called, and answered, through each dialect). One run is on the real pair,
starter, with its draft model: Claude Code's tool-calling turns speculated and
streamed. Claude Code's whole 18.8k-token prompt on starter (949 s to read cold on a
2-core CPU) runs only where ``DRAFTPEN_TEST_FULL_AGENT_PROMPT=1`` asks for it.

What the models answer is their own affair: sampled at the agent's own temperature
they may write "5", or call one of the agent's tools and end without a word. So no
test asserts what the model wrote. The tests assert what draftpen owes: the CLI
finishes its session without an error (it parsed every answer, streamed or not, tool
calls included), every request it sent was answered 200, and, where the CLI reports
it, the usage it read from our stream is what the engine says it read and wrote.
"""

from __future__ import annotations

import json
import os
import re
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
from tests.support.draftpen_cli import REPO
from tests.support.model_files import DRAFT_KEY, TARGET_KEY, require_model

# Each launch's limit: the small pair reads these prompts in about a minute.
CLI_SECONDS = 900
# Claude Code's whole prompt, read cold by the real pair on a CPU, takes far longer.
FULL_PROMPT_SECONDS = 3000
FULL_PROMPT_ENV = "DRAFTPEN_TEST_FULL_AGENT_PROMPT"

SMALL_PAIR = "agents-small"
REAL_PAIR = "starter"
# The context every launch asks for: the small prompts fit with room to answer, and an
# agent that sizes its replies by the context (opencode: a quarter of it, up to 8k
# tokens) asks for at most 1024, so a rambling sampled reply ends within a minute.
CONTEXT = 4096

# What the engine logs for each reply it finished (app/engine/generation_run.py).
FINISHED = re.compile(
    r": (?P<written>\d+) tokens in .*; "
    r"prompt (?P<prompt>\d+) tokens, (?P<cached>\d+) of them cached.*; "
    r"(?P<drafted>\d+) drafted, (?P<accepted>\d+) accepted"
)


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

    def log_lines(self) -> list[str]:
        """The engine log's lines so far."""
        if not self.engine_log.exists():
            return []
        return self.engine_log.read_text().splitlines()


# The agents' homes and projects live at the same paths on every run, and the prompt
# prefixes the engine saved are kept from one run to the next (outside the clone, as
# the model store is): the CLIs write their home and working directory into their
# prompts, so fixed paths let a machine that ran these tests before load the agents'
# prompts instead of reading them again (backends/caches/disk_prefixes.py).
AGENTS_ROOT = Path(
    os.environ.get("DRAFTPEN_TEST_AGENTS_DIR", Path.home() / ".cache" / "draftpen-test-agents")
)
KEPT = Path("draftpen") / "cache" / "prefixes"


# Claude Code's reply cap in these tests, and the words of its error when a reply hits it.
CLAUDE_MAX_OUTPUT_TOKENS = 512
CLAUDE_CAPPED = f"exceeded the {CLAUDE_MAX_OUTPUT_TOKENS} output token maximum"
# Claude Code's agent turns in these tests: two show it read draftpen's answers and
# acted on them (a temperature-1 model may go on calling tools for many more).
CLAUDE_MAX_TURNS = 2
# Claude Code with its minimal prompt (--bare) and one tool: the tool's schema still
# goes through the Messages dialect, and a call to it comes back as a tool_use block.
CLAUDE_SMALL = ["--bare", "--tools", "Bash"]
QUESTION = "What is 2+3? Answer with the number only."

# Codex's own setting for its base instructions (they replace its ~3.5k-token default).
CODEX_INSTRUCTIONS = (
    "You are a coding agent running in a terminal. Answer briefly; "
    "use the shell tool when a task needs it."
)
# opencode's own settings (a file named by OPENCODE_CONFIG, merged under what launch
# passes): its bash tool only, and a short prompt for its build agent.
OPENCODE_SETTINGS = {
    "$schema": "https://opencode.ai/config.json",
    "agent": {"build": {"prompt": CODEX_INSTRUCTIONS.replace("shell", "bash")}},
    "tools": {
        tool: False
        for tool in (
            "edit",
            "write",
            "read",
            "grep",
            "glob",
            "list",
            "patch",
            "todowrite",
            "todoread",
            "webfetch",
            "task",
            "skill",
        )
    },
}


@pytest.fixture(scope="module")
def agents_home() -> Iterator[AgentsHome]:
    require_model(TARGET_KEY)
    small_target = require_model(DRAFT_KEY)
    home = AgentsHome(AGENTS_ROOT)
    fresh_agents_root(home.root)
    # As a user adds a pair of their own files: it lands in the home's own catalog.
    added = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.main",
            "models",
            "add",
            SMALL_PAIR,
            "--target",
            str(small_target),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "DRAFTPEN_HOME": str(home.draftpen), "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert added.returncode == 0, added.stdout + added.stderr
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
    """One ``draftpen launch`` run: its result, the project it ran in, the engine log's
    lines it added, and a report for a failing assertion."""

    result: subprocess.CompletedProcess[str]
    project: Path
    log: list[str]
    report: str

    def requests(self, path: str) -> list[str]:
        """This run's engine log lines for requests to ``path``."""
        return [line for line in self.log if f"POST {path}" in line]

    def finished(self) -> list[re.Match[str]]:
        """What the engine logged for each reply it finished in this run."""
        return [match for line in self.log if (match := FINISHED.search(line))]


def launch(
    agents: AgentsHome,
    agent: str,
    arguments: list[str],
    *,
    pair: str = SMALL_PAIR,
    run: str | None = None,
    environment: dict[str, str] | None = None,
    seconds: int = CLI_SECONDS,
    context: int = CONTEXT,
) -> Launched:
    """``draftpen launch AGENT --pair PAIR -- ARGUMENTS`` in a fresh project directory
    (``run`` names its folder; the agent's name by default)."""
    if shutil.which(agent) is None:
        # packaging/test.sh installs it (install_agent_clis); a run without it is no pass.
        pytest.fail(f"{agent} is not installed: run packaging/test.sh, or npm install it")
    run = run or agent
    env = private_environment(agents, run)
    project = agents.root / run / "project"
    project.mkdir()
    # opencode takes its working directory from $PWD, not from the process's own.
    env["PWD"] = str(project)
    if agent == "claude":
        # Claude Code asks for up to 32,000 tokens at temperature 1: a sampled reply
        # that rambles fills the context. Its own setting bounds the reply as a user
        # would; what the test asserts does not depend on the reply's length.
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(CLAUDE_MAX_OUTPUT_TOKENS)
    env.update(environment or {})
    command = [sys.executable, "-m", "app.main", "launch", agent, "--pair", pair]
    command += ["--context", str(context)]
    before = len(agents.log_lines())
    started = time.monotonic()
    result = subprocess.run(
        [*command, "--", *arguments],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds,
        stdin=subprocess.DEVNULL,
    )
    log = agents.log_lines()[before:]
    requests = [line for line in log if "/health" not in line]
    report = (
        f"launch took {time.monotonic() - started:.0f}s\nstdout:\n{result.stdout}\n"
        f"stderr:\n{result.stderr}\nengine log:\n" + "\n".join(requests[-20:])
    )
    return Launched(result, project, log, report)


def assert_all_answered(launched: Launched, path: str) -> None:
    """The agent sent requests to ``path`` in this run, and each was answered 200."""
    requests = launched.requests(path)
    assert requests, launched.report
    assert all("200 OK" in line for line in requests), launched.report


def run_claude(
    agents: AgentsHome,
    pair: str,
    extra: list[str],
    *,
    run: str,
    question: str = QUESTION,
    seconds: int = CLI_SECONDS,
    context: int = CONTEXT,
) -> Launched:
    """Claude Code's ``-p`` run on ``pair``: a session it ends without an error of
    ours, every request answered, and the usage it read equal to the engine's."""
    arguments = ["-p", question, "--output-format", "json", "--max-turns", str(CLAUDE_MAX_TURNS)]
    launched = launch(agents, "claude", [*arguments, *extra], pair=pair, run=run, seconds=seconds)
    try:
        outcome = json.loads(launched.result.stdout)
    except json.JSONDecodeError:
        pytest.fail(launched.report)
    # A sampled reply (temperature 1) that runs to the test's 512-token cap is cut there
    # by draftpen (stop reason max_tokens), and Claude Code reports that as its own error
    # and exits 1. It read draftpen's answers, which is what this test is about.
    capped = outcome.get("is_error") is True and CLAUDE_CAPPED in str(outcome.get("result"))
    # A model still calling tools after the test's turns ends the same way (subtype
    # error_max_turns): it read and acted on draftpen's replies.
    out_of_turns = outcome.get("subtype") == "error_max_turns"
    if not (capped or out_of_turns):
        assert launched.result.returncode == 0, launched.report
        # Success, whatever the model answered ("result" may be empty after a tool call).
        assert outcome["is_error"] is False and outcome["subtype"] == "success", launched.report
    assert_all_answered(launched, "/v1/messages")
    # The usage Claude Code summed over its turns, from message_start / message_delta,
    # is what the engine read (cached or not) and wrote for them.
    finished = launched.finished()
    assert len(finished) == len(launched.requests("/v1/messages")), launched.report
    usage = outcome["usage"]
    read = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    assert read == sum(int(match["prompt"]) for match in finished), (usage, launched.report)
    assert usage.get("cache_read_input_tokens", 0) == sum(
        int(match["cached"]) for match in finished
    ), (usage, launched.report)
    assert usage["output_tokens"] == sum(int(match["written"]) for match in finished), usage
    return launched


@pytest.mark.real_model
@pytest.mark.agent_cli
def test_claude_code_answers_through_draftpen_launch(agents_home: AgentsHome):
    run_claude(agents_home, SMALL_PAIR, CLAUDE_SMALL, run="claude")


@pytest.mark.real_model
@pytest.mark.agent_cli
def test_codex_answers_through_draftpen_launch(agents_home: AgentsHome):
    instructions = agents_home.root / "codex-instructions.md"
    instructions.write_text(CODEX_INSTRUCTIONS + "\n")
    launched = launch(
        agents_home,
        "codex",
        [
            "exec",
            "-c",
            f"model_instructions_file={json.dumps(str(instructions))}",
            "--skip-git-repo-check",
            QUESTION,
        ],
    )
    # codex exec prints the agent's last message on stdout: empty where the model ended
    # on a tool call, which is its choice. Exit 0 means codex read every response whole.
    assert launched.result.returncode == 0, launched.report
    assert_all_answered(launched, "/v1/responses")


@pytest.mark.real_model
@pytest.mark.agent_cli
def test_opencode_answers_through_draftpen_launch(agents_home: AgentsHome):
    settings = agents_home.root / "opencode-settings.json"
    settings.write_text(json.dumps(OPENCODE_SETTINGS))
    launched = launch(
        agents_home,
        "opencode",
        ["run", QUESTION],
        environment={"OPENCODE_CONFIG": str(settings)},
    )
    # opencode run prints the agent's answer on stdout, or nothing where the model ended
    # on a tool call (its bash tool, say): the model's choice, not the wire's.
    assert launched.result.returncode == 0, launched.report
    assert_all_answered(launched, "/v1/chat/completions")
    # launch's settings came for this run only: it wrote no config file for opencode.
    home = agents_home.root / "opencode" / "home"
    assert not any((home / ".config" / "opencode").glob("opencode.json*"))
    assert not (launched.project / "opencode.json").exists()


@pytest.mark.real_model
@pytest.mark.agent_cli
def test_claude_code_on_the_real_pair_speculates_its_turns(agents_home: AgentsHome):
    # The one run on the real pair: its draft model drafts Claude Code's streamed,
    # tool-calling turns. On this CPU auto may judge drafting not worth it, so the
    # home asks for the draft model, as a user's settings.toml can; the engine the
    # earlier tests started is stopped so that launch starts one that reads it.
    stop_launched_engine(agents_home.draftpen)
    (agents_home.draftpen / "config" / "settings.toml").write_text('drafter = "model"\n')
    launched = run_claude(
        agents_home,
        REAL_PAIR,
        CLAUDE_SMALL,
        run="claude-real-pair",
        question="Write a Python function that adds two numbers, in a code block.",
    )
    finished = launched.finished()
    assert sum(int(match["drafted"]) for match in finished) > 0, launched.report
    assert sum(int(match["accepted"]) for match in finished) > 0, launched.report


@pytest.mark.real_model
@pytest.mark.agent_cli
@pytest.mark.skipif(
    os.environ.get(FULL_PROMPT_ENV) != "1",
    reason=f"Claude Code's whole 18.8k-token prompt on the real pair: {FULL_PROMPT_ENV}=1",
)
def test_claude_code_with_its_whole_prompt_on_the_real_pair(agents_home: AgentsHome):
    # Every one of Claude Code's tools and its whole system prompt: launch's 32k
    # context, the tools' schemas through the Messages dialect and the saved prefix.
    run_claude(
        agents_home,
        REAL_PAIR,
        [],
        run="claude-whole-prompt",
        seconds=FULL_PROMPT_SECONDS,
        context=32768,
    )
