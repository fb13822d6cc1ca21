"""``mlx.launch --backend ring --hostfile hosts.json -- draftpen serve --runtime mlx``: a
target split across two ranks, served by rank 0, writes what one process writes.

Both ranks run on this machine (a hostfile of 127.0.0.1 twice: mlx.launch starts local
ranks without ssh), with MLX's CPU backend and one thread each. The pair is the tiny
random-weight Qwen2 of tests/runtimes/tiny_mlx_pair.py, in a catalog of the test's own. A real
HTTP client asks rank 0 over its Unix socket for a greedy reply; a one-process
``serve --runtime mlx`` on the same pair answers the same request first.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.runtimes.tiny_mlx_pair import mlx_pair_catalog, store_converted, tiny_qwen2_pair
from tests.support.draftpen_cli import REPO
from tests.support.serve_process import LISTENING, RunningServer, start_server

pytest.importorskip("mlx_lm")

pytestmark = pytest.mark.real_model

PAIR = "tiny-split-pair"
TARGET = "tiny-split-target"
DRAFT = "tiny-split-draft"
MAX_TOKENS = 24
# One thread per rank: the machine may be busy, and the ranks must not fight for it.
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Draft-model rounds of K=3: rejected drafts roll back every rank's cache.
REQUEST: dict[str, Any] = {
    "model": PAIR,
    "messages": [{"role": "user", "content": "Name three rivers, then stop."}],
    "temperature": 0,
    "max_tokens": MAX_TOKENS,
    "speculative": {"drafter": "model", "k": 3},
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A DRAFTPEN_HOME whose catalog and store hold the tiny pair (set in the
    environment after conftest's own, which the servers inherit)."""
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    built = tiny_qwen2_pair(home / "built", conversion_facts=True)  # before the catalog
    catalog = home / "models.toml"
    catalog.write_text(mlx_pair_catalog(PAIR, TARGET, DRAFT, "qwen2"))
    monkeypatch.setenv("DRAFTPEN_CATALOG", str(catalog))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(home / "models"))
    for name, value in THREADS.items():
        monkeypatch.setenv(name, value)
    store_converted(home / "models", dict(zip((TARGET, DRAFT), built, strict=True)))
    return home


def _ask(server: RunningServer) -> tuple[str, dict[str, Any]]:
    """The greedy reply to REQUEST, and /health after it."""
    with server.client() as client:
        response = client.post("/v1/chat/completions", json=REQUEST)
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["message"]["content"]
    return text, server.health()


def _free_port_pair() -> int:
    """A port P with P and P + 1 free (mlx.launch's ring listens on one port per rank)."""
    for _ in range(20):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    pytest.fail("no two neighbouring free ports")


def _launch_split(home: Path, *serve_options: str) -> tuple[subprocess.Popen[str], Path]:
    """``mlx.launch`` two local ranks of ``draftpen serve``, as a user would; returns it
    once rank 0 listens, and the file its output (both ranks') goes to."""
    launcher = Path(sys.executable).with_name("mlx.launch")
    if not launcher.exists():
        pytest.skip(f"mlx.launch is not installed beside {sys.executable}")
    hostfile = home / "hosts.json"
    hosts = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]} for _ in range(2)]
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": hosts}))
    socket_path = home / "split.sock"
    serve = [sys.executable, "-m", "app.main", "serve", "--runtime", "mlx", "--pair", PAIR]
    command = [
        sys.executable,
        str(launcher),
        *("--backend", "ring", "--hostfile", str(hostfile), "--cwd", str(REPO)),
        *("--starting-port", str(_free_port_pair()), "--"),
        *serve,
        *("--socket", str(socket_path), *serve_options),
    ]
    log_path = home / "split.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env={**os.environ, "DRAFTPEN_HOME": str(home)},
            # mlx.launch relays its stdin to the ranks; an open pipe, not /dev/null,
            # whose endless end-of-file its loop would spin on.
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,  # its ranks with it, for the cleanup below
        )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 120)
    line = process.stdout.readline() if ready else ""
    if not line.startswith(LISTENING):
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"split serve did not start: {line!r}\n{log_path.read_text()}")
    return process, socket_path


def test_a_target_split_over_two_ranks_serves_what_one_process_serves(home: Path) -> None:
    alone_server = start_server(home, home / "alone.sock", "--runtime", "mlx", pair=PAIR)
    try:
        alone, alone_health = _ask(alone_server)
    finally:
        alone_server.stop()
    assert alone_health["loaded"][0]["target_placement"] is None  # one process: not said

    launched, socket_path = _launch_split(home, "--parallel", "2", "--mlx-split", "pipeline")
    server = RunningServer(launched, socket_path, home / "split.log")
    try:
        split_up, health = _ask(server)
        with server.client() as client:  # another context would need every rank to reload
            refused = client.post("/draftpen/load", json={"pair": PAIR, "context_length": 512})
        os.kill(health["pid"], signal.SIGTERM)  # stopping rank 0 ends rank 1 (CLOSE)
        assert launched.wait(timeout=60) == 0, server.log()
    finally:
        if launched.poll() is None:
            os.killpg(launched.pid, signal.SIGKILL)
    assert split_up == alone and split_up
    (loaded,) = health["loaded"]
    assert loaded["target_placement"].startswith("pipeline split over 2 ranks")
    assert loaded["draft_placement"] is None and loaded["draft"] == DRAFT
    assert loaded["conversation_cache"] is None  # a split target keeps no states
    assert health["queue"]["parallel"] == 1
    assert "split across 2 ranks" in health["queue"]["parallel_refusal"]
    assert "split_target_fixed" in refused.text
    log = server.log()
    assert "draftpen serve (rank 1 of 2): holding a pipeline split" in log
    assert "draftpen serve (rank 1 of 2): rank 0 closed the model; stopping" in log
