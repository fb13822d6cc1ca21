"""The installer's runtime check, kept in the environment it checked.

``install.sh`` and ``test.sh`` run the runtime check right after installing
llama-cpp-python (``verify_llama_runtime`` in packaging/lib.sh). Its result is written
into that virtual environment, beside the library it checked, so ``draftpen doctor``
can show later that the check ran, on which build, and what it found. A venv copied from
another machine brings its record along; doctor's own check, shown beside it, is always
of this machine.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.runtime_check.check import RuntimeCheck

RECORD_NAME = "draftpen-install-check.json"
# Tests (and the installer's own tests) point the record elsewhere.
RECORD_ENV = "DRAFTPEN_INSTALL_CHECK_RECORD"


@dataclass(frozen=True)
class InstallCheck:
    """What the installer's runtime check found, and on which build."""

    outcome: str  # as RuntimeCheck.outcome: "ok", "crashed", ...
    summary: str
    build: str  # the flavour installed ("cpu", "cuda", "portable", ...) as lib.sh names it
    checked_at: float  # seconds since the epoch
    llama_cpp_version: str | None = None

    def describe(self) -> str:
        """One line, e.g. ``the runtime check of the cpu build of llama-cpp-python 0.3.36
        passed on 2026-11-26 09:00`` (and what went wrong, when it did not pass)."""
        version = f" of llama-cpp-python {self.llama_cpp_version}" if self.llama_cpp_version else ""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.checked_at))
        text = f"the runtime check of the {self.build} build{version}"
        if self.outcome == "ok":
            return f"{text} passed on {when}"
        return f"{text} ended {self.outcome} on {when}: {self.summary}"

    def as_json(self) -> dict[str, Any]:
        """The record as plain data."""
        return asdict(self)


def record_path() -> Path:
    """Where this environment's record is: ``DRAFTPEN_INSTALL_CHECK_RECORD`` or the venv."""
    named = os.environ.get(RECORD_ENV)
    return Path(named) if named else Path(sys.prefix) / RECORD_NAME


def write_install_check(path: Path, check: RuntimeCheck, build: str) -> InstallCheck:
    """Write the record of ``check`` on ``build`` to ``path`` (atomically)."""
    record = InstallCheck(
        outcome=check.outcome,
        summary=check.summary,
        build=build,
        checked_at=time.time(),
        llama_cpp_version=check.llama_cpp_version,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(descriptor, "w") as file:
        json.dump(record.as_json(), file, indent=2)
    os.replace(temporary, path)
    return record


def read_install_check(path: Path | None = None) -> InstallCheck | None:
    """The installer's record for this environment; None if there is none or it is unreadable."""
    try:
        data = json.loads((path or record_path()).read_text(encoding="utf-8"))
        return InstallCheck(
            outcome=str(data["outcome"]),
            summary=str(data["summary"]),
            build=str(data["build"]),
            checked_at=float(data["checked_at"]),
            llama_cpp_version=data.get("llama_cpp_version"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
