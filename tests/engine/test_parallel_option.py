"""``draftpen serve --parallel``: a count it cannot use is refused before anything loads,
with the values it takes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", ["0", "17", "many", "-2"])
def test_serve_refuses_a_parallel_count_it_cannot_use_saying_what_it_takes(
    value: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.main", "serve", f"--parallel={value}"],
        cwd=REPO,
        env={**os.environ, "DRAFTPEN_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "--parallel must be auto or a number from 1 to 16." in result.stderr
    assert not list(tmp_path.rglob("*.sock"))  # refused before it took a socket
