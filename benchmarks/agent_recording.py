"""Record a real agent CLI's sessions through a real engine: every request it sends, in
order, to a JSON-lines file that ``benchmarks/agent_replay.py`` replays (issue 55,
part 6; a benchmark's tool, not a test).

It starts ``draftpen serve`` (``benchmarks/serve_process.py``) and, in front of it, a
recording proxy on another loopback port that passes each request through unchanged
and streams the answer back as it comes; the agent is pointed at the proxy with the
same settings ``draftpen launch`` gives it (``app/cli/agent_settings.py``). Each
session is one run of the agent's non-interactive mode (``codex exec``) on a small
repository (``shop/``: a README, a package and its tests), so the sessions repeat each
other as an agent's do:

1. ``store``: write ``inventory/store.py`` to the README's spec and run the tests;
2. ``store again``: the same task in a fresh copy of the repository (a sub-agent given
   the same task, a retry after a timeout);
3. ``fix``: a test fails in the first session's repository: fix it and run the tests;
4. ``catalog``: the same scaffold for ``library/catalog.py``.

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        python benchmarks/agent_recording.py --pair starter --out sessions.jsonl

The agent runs the commands it chooses inside ``--workdir`` (Codex's
``workspace-write`` sandbox where this kernel supports it, ``--sandbox``). What the
model writes is its own; the recording keeps what it sent, whatever it did.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from app.cli.agent_settings import AGENTS, Endpoint, agent_plan
from app.settings import MODELS_DIR_ENV, models_dir
from benchmarks.serve_process import start_serve, stop_serve, tree_commit

README = """# shop

Two small packages a shop and a library use.

- `inventory/store.py`: a dataclass `Item` (name: str, price: float, quantity: int) and
  a class `Store` that keeps items in a dict by name, with methods `add(item)`,
  `remove(name)`, `restock(name, quantity)`, `sell(name, quantity)` (raises ValueError
  when asked for more than is in stock), `total_value()`, `low_stock(threshold)`
  (the names of items with fewer than `threshold`, sorted) and `to_json()` /
  `Store.from_json(text)`.
- `library/catalog.py`: the same for books: a dataclass `Book` (title, author,
  copies) and a class `Catalog` with `add`, `remove`, `restock`, `lend` (raises
  ValueError when asked for more copies than it has), `total_copies()`,
  `scarce(threshold)` (titles, sorted) and `to_json()` / `Catalog.from_json(text)`.

Run the tests with `python -m pytest -q`.
"""

STORE_TESTS = """from inventory.store import Item, Store


def test_sell_refuses_more_than_in_stock():
    store = Store()
    store.add(Item("pen", 1.5, 3))
    store.sell("pen", 2)
    try:
        store.sell("pen", 2)
    except ValueError:
        pass
    else:
        raise AssertionError("sold more than was in stock")


def test_low_stock_is_sorted():
    store = Store()
    for name in ("zip", "apple", "mango"):
        store.add(Item(name, 1.0, 1))
    assert store.low_stock(5) == ["apple", "mango", "zip"]


def test_json_round_trip():
    store = Store()
    store.add(Item("pen", 1.5, 3))
    assert Store.from_json(store.to_json()).total_value() == store.total_value()
"""

STORE_TASK = (
    "Create inventory/store.py as the README describes, then run the tests with "
    "`python -m pytest -q` and fix what fails."
)
FIX_TASK = (
    "The test test_low_stock_is_sorted fails: low_stock must return the names sorted. "
    "Fix inventory/store.py and run `python -m pytest -q`."
)
CATALOG_TASK = (
    "Create library/catalog.py as the README describes (the same shape as "
    "inventory/store.py if it exists), then run `python -m pytest -q`."
)
# (name, task, which repository: "new" a fresh copy, else the name of an earlier one)
SESSIONS = (
    ("store", STORE_TASK, "new"),
    ("store again", STORE_TASK, "new"),
    ("fix", FIX_TASK, "store"),
    ("catalog", CATALOG_TASK, "store"),
)


def make_repository(root: Path) -> Path:
    """A fresh ``shop/`` repository (a git repository, as agents expect) under ``root``."""
    shop = root / "shop"
    (shop / "inventory").mkdir(parents=True)
    (shop / "library").mkdir()
    (shop / "tests").mkdir()
    (shop / "README.md").write_text(README)
    (shop / "inventory" / "__init__.py").write_text("")
    (shop / "library" / "__init__.py").write_text("")
    (shop / "tests" / "test_store.py").write_text(STORE_TESTS)
    (shop / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "shop"]):
        subprocess.run(
            ["git", "-c", "user.name=a", "-c", "user.email=a@b", *command],
            cwd=shop,
            check=True,
        )
    return shop


class Recorder:
    """The requests seen so far, each with the session it belongs to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.session = ""
        self.lock = threading.Lock()
        self.count = 0

    def record(self, method: str, path: str, body: bytes) -> None:
        """Append one request (its JSON body, or its text where it is not JSON)."""
        try:
            payload: Any = json.loads(body) if body else None
        except ValueError:
            payload = body.decode("utf-8", "replace")
        line = {"session": self.session, "method": method, "path": path, "body": payload}
        with self.lock, self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")
            self.count += 1


def proxy_server(engine_url: str, recorder: Recorder) -> ThreadingHTTPServer:
    """A loopback HTTP server that records each request and passes it to the engine."""
    client = httpx.Client(base_url=engine_url, timeout=httpx.Timeout(3600.0))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the answer ends when the connection closes

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.command == "POST":
                recorder.record(self.command, self.path, body)
            headers = {
                key: value
                for key, value in self.headers.items()
                if key.lower() not in ("host", "content-length", "connection")
            }
            request = client.build_request(self.command, self.path, headers=headers, content=body)
            response = client.send(request, stream=True)
            try:
                self.send_response(response.status_code)
                for key in ("content-type", "cache-control"):
                    if key in response.headers:
                        self.send_header(key, response.headers[key])
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in response.iter_raw():
                    self.wfile.write(chunk)
                    self.wfile.flush()
            finally:
                response.close()

        do_GET = do_POST = _forward

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the engine logs each request

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def codex_arguments(task: str, sandbox: str) -> list[str]:
    """``codex exec`` for one session."""
    return ["exec", "--skip-git-repo-check", "-s", sandbox, task]


def agent_environment(home: Path) -> dict[str, str]:
    """This run's environment with the agent's home and XDG folders private to it, and
    ``python`` on its PATH (this interpreter, which has pytest), as a developer's has."""
    home.mkdir(parents=True, exist_ok=True)
    tools = home / "bin"
    tools.mkdir(exist_ok=True)
    python = tools / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    skipped = ("XDG_", "OPENCODE", "ANTHROPIC_", "CODEX_", "DRAFTPEN_API_KEY")
    env = {key: value for key, value in os.environ.items() if not key.startswith(skipped)}
    env["PATH"] = f"{tools}{os.pathsep}{env.get('PATH', '')}"
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    env.update(XDG_DATA_HOME=str(home / ".local/share"), XDG_CACHE_HOME=str(home / ".cache"))
    return env


def run_sessions(args: argparse.Namespace, proxy_url: str, key: str, recorder: Recorder) -> None:
    """Run each session's agent in its repository; print what each did."""
    agent = AGENTS["codex"]
    executable = shutil.which(agent.executable)
    if executable is None:
        raise SystemExit("codex is not installed (packaging/test.sh installs it)")
    endpoint = Endpoint(url=proxy_url, key=key, pair=args.pair, context=args.context)
    repositories: dict[str, Path] = {}
    for name, task, where in SESSIONS:
        if where == "new":
            repository = make_repository(args.workdir / name.replace(" ", "-"))
        else:
            repository = repositories[where]
        repositories[name] = repository
        recorder.session = name
        before = recorder.count
        env = agent_environment(args.workdir / "agent-home" / name.replace(" ", "-"))
        plan = agent_plan(agent, executable, endpoint, codex_arguments(task, args.sandbox), env)
        started = time.monotonic()
        result = subprocess.run(
            plan.command,
            cwd=repository,
            env={**plan.environment, "PWD": str(repository)},
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=args.session_seconds,
            check=False,
        )
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=repository,
            capture_output=True,
            text=True,
            check=False,
        )
        summary = (tests.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(
            f"{name:12} exit {result.returncode}, {recorder.count - before} requests, "
            f"{time.monotonic() - started:6.0f} s; the repository's tests: {summary}",
            flush=True,
        )
        if result.returncode != 0:
            print(result.stderr[-2000:], file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--context", type=int, default=AGENTS["codex"].context)
    parser.add_argument("--out", type=Path, required=True, help="the JSON-lines recording")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    parser.add_argument("--sandbox", default="workspace-write", help="codex's -s")
    parser.add_argument("--session-seconds", type=int, default=1800)
    args = parser.parse_args()
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="agent-recording-"))
    args.out.unlink(missing_ok=True)
    recorder = Recorder(args.out)
    home = args.workdir / "draftpen-home"
    environment = {MODELS_DIR_ENV: str(models_dir())}
    process, url, key = start_serve(
        args.pair, args.context, home, name="agent-recording", environment=environment
    )
    server = proxy_server(url, recorder)
    try:
        proxy_url = f"http://127.0.0.1:{server.server_address[1]}"
        print(f"recording {args.pair} at {tree_commit()} into {args.out}", flush=True)
        run_sessions(args, proxy_url, key, recorder)
    finally:
        server.shutdown()
        stop_serve(process)
    print(f"{recorder.count} requests recorded; the repositories are in {args.workdir}")


def recorded(path: Path) -> Iterator[dict[str, Any]]:
    """The requests of a recording, in order."""
    with path.open() as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


if __name__ == "__main__":
    main()
