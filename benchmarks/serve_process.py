"""A real ``draftpen serve`` for a benchmark: started on a private socket and a free
TCP port behind an API key, and stopped again; and the commit a benchmark ran at
(shared by the agent and concurrency benchmarks)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


def start_serve(
    pair: str,
    context: int,
    home: Path,
    *,
    name: str,
    arguments: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
    repo: Path = REPO,
) -> tuple[subprocess.Popen[str], str, str]:
    """``draftpen serve --pair PAIR --context N --tcp 127.0.0.1:0 ARGUMENTS`` in
    DRAFTPEN_HOME ``home``, from the source tree ``repo`` (default: this one); its
    process, TCP URL and API key (``name`` names the socket's folder and the key).
    Exits the benchmark if the engine does not start."""
    socket_path = Path(tempfile.mkdtemp(prefix=f"{name}-")) / "e.sock"
    key = f"{name}-benchmark"
    command = [sys.executable, "-m", "app.main", "serve", "--pair", pair]
    command += ["--context", str(context), "--socket", str(socket_path)]
    command += ["--tcp", "127.0.0.1:0", *arguments]
    env = {**os.environ, "DRAFTPEN_HOME": str(home), "DRAFTPEN_API_KEY": key}
    env["PYTHONPATH"] = str(repo)  # the tree's own code, not the installed one's
    env.update(environment or {})
    process = subprocess.Popen(
        command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=sys.stderr, text=True
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 1800)
    if not ready or "listening on unix:" not in process.stdout.readline():
        process.kill()
        raise SystemExit("draftpen serve did not start")
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport, base_url="http://draftpen") as client:
        url = client.get("/health").json()["tcp"]
    return process, url, key


def stop_serve(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, and a kill if it has not stopped within a minute (any server process)."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def tree_commit(repo: Path = REPO) -> str:
    """The commit of the tree ``repo`` (default: this one), short, with ``+changes``
    when it has uncommitted ones (for a benchmark's report)."""

    def git(*arguments: str) -> str:
        command = ["git", *arguments]
        return subprocess.run(command, cwd=repo, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "-uno")
    return f"{git('rev-parse', '--short', 'HEAD')}{'+changes' if dirty else ''}"
