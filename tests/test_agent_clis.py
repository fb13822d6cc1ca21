"""The agent CLIs people run, as published on npm, answering through ``draftpen launch``.

Each test runs a real CLI (installed by the test setup: ``npm install -g opencode-ai``
...) through ``draftpen launch``, which starts an engine on TCP with its API key in a
private ``DRAFTPEN_HOME``, loads the starter pair and passes the CLI its settings; the
CLI's home and XDG directories are private too, so nothing of the user's is read or
written. They are slow on a CPU (the agents' prompts are thousands of tokens), so they
are marked ``agent_cli`` and can be run alone: ``pytest -m agent_cli``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.client import find_engine
from tests.model_files import DRAFT_KEY, TARGET_KEY, require_model
from tests.test_cli_generate import REPO

# A CPU reads an agent's prompt for minutes; loading measures forward costs once.
CLI_SECONDS = 3000


def private_environment(tmp_path: Path) -> dict[str, str]:
    """The test's environment with draftpen's and the CLI's homes under ``tmp_path``."""
    home = tmp_path / "home"
    home.mkdir()
    skipped = ("XDG_", "OPENCODE", "ANTHROPIC_", "DRAFTPEN_HOME", "DRAFTPEN_API_KEY")
    return {
        **{name: value for name, value in os.environ.items() if not name.startswith(skipped)},
        "DRAFTPEN_HOME": str(tmp_path / "draftpen"),
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


@pytest.mark.real_model
@pytest.mark.agent_cli
def test_opencode_answers_through_draftpen_launch(tmp_path: Path):
    if shutil.which("opencode") is None:
        pytest.fail("opencode is not installed: npm install -g opencode-ai")
    require_model(TARGET_KEY)
    require_model(DRAFT_KEY)
    env = private_environment(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    command = [sys.executable, "-m", "app.main", "launch", "opencode", "--pair", "starter"]
    started = time.monotonic()
    try:
        result = subprocess.run(
            # The number only: a 1.5B model asked a bare "What is 2+3?" may reach for
            # opencode's bash tool first, and that is the model's choice, not the wire's.
            [*command, "--", "run", "What is 2+3? Answer with the number only."],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=CLI_SECONDS,
            stdin=subprocess.DEVNULL,
        )
    finally:
        stop_launched_engine(tmp_path / "draftpen")
    engine_log = tmp_path / "draftpen" / "cache" / "engine.log"
    requests = [line for line in engine_log.read_text().splitlines() if "/health" not in line]
    report = (
        f"launch took {time.monotonic() - started:.0f}s\nstdout:\n{result.stdout}\n"
        f"stderr:\n{result.stderr}\nengine log:\n" + "\n".join(requests[-20:])
    )
    assert result.returncode == 0, report
    # opencode run prints the agent's answer on stdout.
    assert "5" in result.stdout, report
    assert "running opencode on 'starter'" in result.stderr
    # Its settings came for this run only: no config file was written for it.
    config_dir = Path(env["XDG_CONFIG_HOME"]) / "opencode"
    assert not any(config_dir.glob("opencode.json*")) and not (project / "opencode.json").exists()
