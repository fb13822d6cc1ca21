"""The ``draftpen`` command run as a user runs it (a subprocess from the repository root),
and the shape every error of it must have: one clear line on stderr, a non-zero exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_draftpen(*args: str, env: dict[str, str] | None = None, stdin: str | None = None):
    """Run the CLI as a user would; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "app.main", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_clean_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
