"""The install a user gets, tested as a user gets it.

``bash packaging/test.sh`` installs draftpen editable with its test extras, so the rest
of the suite never sees the install that ``packaging/install.sh`` makes: the project
without ``[test]``. An import satisfied only by a test extra (httpx, once) passes every
other test and leaves a draftpen that cannot start. This test runs the README's first
command itself (``install.sh --no-run``) on a copy of this working tree, into a fresh
virtualenv and home of its own, with the machine's llama-cpp-python wheel cache and the
test model store, then starts every command a user starts first.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_MODELS_DIR

pytestmark = pytest.mark.real_model

REPO_ROOT = Path(__file__).resolve().parents[2]
# The pip install, a cached wheel and the runtime check: about a minute with pip's cache
# warm, several where PyPI is slow.
INSTALL_TIMEOUT_S = 1200
COMMAND_TIMEOUT_S = 300

# The runtime packages a platform may lack: MLX exists on Apple Silicon only (install.sh
# adds it there). Any other failed import is an undeclared dependency.
PLATFORM_ONLY_MODULES = {"mlx", "mlx_lm"}

IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, sys
import app, backends
failures = {}
for package in (app, backends):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(module.name)
        except BaseException as error:  # noqa: BLE001 - every failure is reported
            # The module that was missing, also where a runtime wraps its ImportError.
            missing = error
            while missing is not None and not isinstance(missing, ImportError):
                missing = missing.__cause__ or missing.__context__
            failures[module.name] = [type(error).__name__,
                                     getattr(missing, "name", None) or "", str(error)]
json.dump(failures, sys.stdout)
"""


def copy_of_the_working_tree(destination: Path) -> Path:
    """The files a fresh clone of this working tree has (tracked, and new but not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        source = REPO_ROOT / relative
        if not source.is_file():  # deleted in the working tree, not yet committed
            continue
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return destination


def user_environment(home: Path, draftpen_home: Path) -> dict[str, str]:
    """A shell as a new user has it: no virtualenv active, nothing of the test run's own.

    The machine's caches are kept (``XDG_CACHE_HOME``): the compiled llama-cpp-python
    wheel and pip's downloads, as a user's second install would find them.
    """
    dev_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(
        part for part in os.environ.get("PATH", "").split(os.pathsep) if part != dev_bin
    )
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    environment = {
        "PATH": path,
        "HOME": str(home),
        "XDG_CACHE_HOME": cache,
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        # The Python this virtualenv was made from: a user's python3.11, not our venv.
        "PYTHON": getattr(sys, "_base_executable", sys.executable),
        "DRAFTPEN_HOME": str(draftpen_home),
        "DRAFTPEN_MODELS_DIR": str(TEST_MODELS_DIR),
        "LANG": "C.UTF-8",
        "CI": "true",
    }
    # The llama-cpp-python build the suite was set up with (a forced flavour, extra flags).
    for name, value in os.environ.items():
        if name.startswith("DRAFTPEN_LLAMA") or name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
            environment[name] = value
    return environment


def run(command: list[str], environment: dict[str, str], timeout: float, cwd: Path) -> str:
    result = subprocess.run(
        command,
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}\n"
        f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    )
    return result.stdout


def test_install_sh_gives_a_draftpen_whose_every_command_starts(
    tmp_path: Path, draftpen_home: Path
) -> None:
    clone = copy_of_the_working_tree(tmp_path / "clone")
    home = tmp_path / "home"
    home.mkdir()
    venv = tmp_path / "venv"
    environment = user_environment(home, draftpen_home)

    installed = run(
        ["bash", str(clone / "packaging" / "install.sh"), "--no-run", "--venv", str(venv)],
        environment,
        INSTALL_TIMEOUT_S,
        cwd=home,
    )
    assert "Start chatting with: draftpen" in installed
    draftpen = home / ".local" / "bin" / "draftpen"
    assert draftpen.resolve() == (venv / "bin" / "draftpen").resolve()

    # The user's install, not the developer's: no test extra came along.
    frozen = run([str(venv / "bin" / "python"), "-m", "pip", "freeze"], environment, 120, home)
    installed_names = {line.split("==")[0].split(" @ ")[0].lower() for line in frozen.split()}
    assert not {"pytest", "deptry", "openai", "anthropic"} & installed_names
    assert "draftpen" in installed_names

    assert "usage: draftpen" in run([str(draftpen), "--help"], environment, 120, home)
    doctor = json.loads(run([str(draftpen), "doctor", "--json"], environment, 300, home))
    assert doctor, "draftpen doctor --json printed an empty report"

    failures = json.loads(
        run([str(venv / "bin" / "python"), "-c", IMPORT_EVERY_MODULE], environment, 300, home)
    )
    apple_silicon = sys.platform == "darwin" and platform.machine() == "arm64"
    undeclared = {
        module: failure
        for module, failure in failures.items()
        if apple_silicon or failure[1].split(".")[0] not in PLATFORM_ONLY_MODULES
    }
    assert undeclared == {}

    reply = run(
        [
            str(draftpen),
            "generate",
            "--pair",
            "smollm2",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "--prompt",
            "Name a colour.",
        ],
        environment,
        COMMAND_TIMEOUT_S,
        home,
    )
    assert reply.strip(), "draftpen generate --pair smollm2 printed no reply"
