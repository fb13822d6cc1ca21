"""Running packaging/lib.sh's functions in bash, the way install.sh and test.sh use them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIB_SH = REPO / "packaging" / "lib.sh"


# -- packaging/lib.sh, in bash ----------------------------------------------------------


def lib_sh(
    script: str, *, env: dict[str, str] | None = None, machine: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in bash after sourcing lib.sh. ``machine`` fakes ``uname -m``."""
    fake_uname = ""
    if machine:
        fake_uname = (
            f'uname() {{ if [[ "$1" == -m ]]; then echo {machine}; '
            'else command uname "$@"; fi; }\n'
        )
    clean = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DRAFTPEN_LLAMA", "DRAFTPEN_CPUINFO", "DRAFTPEN_RUNTIME_CHECK"))
    }
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n. {LIB_SH}\n{fake_uname}{script}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **(env or {})},
        cwd=REPO,
    )


def shell_output(script: str, **kwargs: object) -> str:
    result = lib_sh(script, **kwargs)  # type: ignore[arg-type]
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
