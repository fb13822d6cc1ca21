"""What the prefix cache on disk saves, costs and takes (a benchmark, not a test).

Three questions, one subcommand each:

``sizes``: how many bytes a token of saved state takes, for each catalog pair (target
plus draft, f16 keys and values, from the shapes in models.toml), and what an agent's
prompt (Claude Code ~18,800 tokens, opencode ~7,200, Codex ~6,100) takes on disk.

``load``: on this machine, loading a saved prefix against reading it: a prompt of
``--tokens`` tokens read by the target (tokens/s), its state copied and written (GB/s),
then read back from the file and restored into a fresh model (GB/s), as seconds per
token each way. The file is read cold where the OS allows (``posix_fadvise``
DONTNEED), so the figure is the disk's, not the page cache's.

``launch``: time to first token of ``draftpen launch AGENT`` on a freshly started engine,
with an empty prefix cache and then with the one the first run left (a second session),
from the engine's log (the first request's prompt reading, its cached tokens) and the
launch's wall time. Needs the agent CLIs on PATH (packaging/test.sh installs them).

    PYTHONPATH=. python benchmarks/prefix_cache.py sizes
    DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models PYTHONPATH=. \\
        python benchmarks/prefix_cache.py load --pair starter --tokens 4096
    DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models PYTHONPATH=. \\
        python benchmarks/prefix_cache.py launch codex opencode claude
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENT_PROMPTS = {"claude": 18_800, "opencode": 7_200, "codex": 6_100}
AGENT_ARGUMENTS = {
    "claude": ["-p", "What is 2+3?", "--output-format", "json"],
    "codex": ["exec", "--skip-git-repo-check", "What is 2+3? Answer with the number only."],
    "opencode": ["run", "What is 2+3? Answer with the number only."],
}
# llama.cpp's per-cell bookkeeping in a sequence state: position, seq-id count, seq id.
CELL_BYTES = 12
REQUEST_LINE = re.compile(r"prompt (\d+) tokens, (\d+) of them cached, read in ([\d.]+)s")


def sizes() -> None:
    """Bytes per token of saved state for each catalog pair (an upper bound for models
    with sliding-window layers, Gemma's, whose windowed layers keep fewer cells; a
    hybrid target, Qwen3.6's, adds its recurrent state, a few MB whatever the length)."""
    from app.models.catalog_file import load_catalog

    catalog = load_catalog()
    print(
        f"{'pair':<28} {'target B/tok':>12} {'draft B/tok':>12} {'pair B/tok':>11}  "
        + "  ".join(f"{agent} ({tokens:,})" for agent, tokens in AGENT_PROMPTS.items())
    )
    for pair in catalog.pairs:
        variant = pair.variants[0]
        target = catalog.model(variant.target)
        draft = catalog.model(variant.draft) if variant.draft else None
        per_target = (target.kv_bytes_per_token or 0) + CELL_BYTES
        per_draft = (draft.kv_bytes_per_token or 0) + CELL_BYTES if draft else 0
        per_pair = per_target + per_draft
        known = target.kv_bytes_per_token is not None
        cells = "  ".join(
            f"{per_pair * tokens / 1e9:>7.2f} GB" for tokens in AGENT_PROMPTS.values()
        )
        note = "" if known else "  (shapes not in the catalog)"
        print(f"{pair.key:<28} {per_target:>12,} {per_draft:>12,} {per_pair:>11,}  {cells}{note}")


def _drop_from_page_cache(path: Path) -> None:
    if hasattr(os, "posix_fadvise"):
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def load(pair: str, tokens: int) -> None:
    """Loading a saved prefix against reading it, on this machine."""
    from app.models.pair_files import pair_files
    from backends.caches.disk_prefixes import DiskPrefixes
    from backends.caches.prefix_keys import block_names
    from backends.caches.prefix_store import PrefixStore
    from backends.select import choose_runtime, load_model

    runtime = choose_runtime(None)
    files = pair_files(pair, runtime)
    prompt = [(index * 7919) % 20_000 + 100 for index in range(tokens)]
    for role, path in (("target", files.target_path), ("draft", files.draft_path)):
        if path is None:
            continue
        directory = Path(tempfile.mkdtemp(prefix="prefix-bench-"))
        try:
            store = PrefixStore(directory, 1 << 40)
            prefixes = DiskPrefixes(store)
            model = load_model(path, runtime=runtime, n_ctx=tokens + 64)
            started = time.perf_counter()
            model.prefill(prompt)
            read_seconds = time.perf_counter() - started
            key = prefixes.key_for(model)
            names = block_names(key, prompt)
            started = time.perf_counter()
            state = model.save_state()
            copy_seconds = time.perf_counter() - started
            started = time.perf_counter()
            store.write(
                key,
                role,
                state.tokens,
                names,
                cuttable=True,
                nbytes=state.nbytes,
                encode=lambda file, model=model, state=state: model.write_state(state, file),
            )
            write_seconds = time.perf_counter() - started
            model.close()
            (entry,) = store.entries()
            _drop_from_page_cache(directory / f"{entry.entry}.prefix")
            fresh = load_model(path, runtime=runtime, n_ctx=tokens + 64)
            started = time.perf_counter()
            hit = store.find(key, names)
            assert hit is not None
            read = store.read(hit, key, fresh.read_state)
            assert read is not None
            fresh.restore_state(read[1])
            load_seconds = time.perf_counter() - started
            fresh.close()
            gigabytes = entry.nbytes / 1e9
            print(
                f"{role} {path.name}: {tokens} tokens, state {gigabytes:.3f} GB "
                f"({entry.nbytes / tokens:,.0f} B/token)\n"
                f"  read the prompt {read_seconds:.2f} s ({tokens / read_seconds:.1f} tok/s)\n"
                f"  copy {copy_seconds:.3f} s (on the request's path), write {write_seconds:.3f} s "
                f"({gigabytes / write_seconds:.2f} GB/s, off it)\n"
                f"  load from a cold file and restore {load_seconds:.3f} s "
                f"({gigabytes / load_seconds:.2f} GB/s): "
                f"{read_seconds / load_seconds:.0f}x faster than reading"
            )
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def _stop_engine(home: Path) -> None:
    from app.client import find_engine

    for socket_path in (home / "run").glob("*.sock"):
        client = find_engine(socket_path)
        if client is not None:
            os.kill(client.health().pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while socket_path.exists() and time.monotonic() < deadline:
                time.sleep(0.2)


def _one_launch(root: Path, agent: str) -> tuple[float, list[tuple[int, int, float]]]:
    """Run one session on a fresh engine; (wall seconds, (prompt, cached, read s) per request)."""
    home = root / "draftpen"
    log = home / "cache" / "engine.log"
    log.unlink(missing_ok=True)
    agent_home = root / agent / "home"
    project = root / agent / "project"
    shutil.rmtree(root / agent, ignore_errors=True)
    agent_home.mkdir(parents=True)
    project.mkdir(parents=True)
    skipped = ("XDG_", "OPENCODE", "ANTHROPIC_", "CODEX_", "DRAFTPEN_HOME", "DRAFTPEN_API_KEY")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skipped)}
    env.update(
        DRAFTPEN_HOME=str(home),
        HOME=str(agent_home),
        PWD=str(project),
        PYTHONPATH=str(Path(__file__).resolve().parent.parent),
    )
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "app.main",
            "launch",
            agent,
            "--pair",
            "starter",
            "--",
            *AGENT_ARGUMENTS[agent],
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    wall = time.monotonic() - started
    _stop_engine(home)
    lines = log.read_text().splitlines() if log.exists() else []
    requests = [
        (int(m[1]), int(m[2]), float(m[3])) for line in lines if (m := REQUEST_LINE.search(line))
    ]
    return wall, requests


def launch(agents: list[str], root: Path) -> None:
    """A first session with an empty prefix cache, then a second on a fresh engine."""
    for agent in agents:
        shutil.rmtree(root / "draftpen" / "cache" / "prefixes", ignore_errors=True)
        for label in ("cold (empty cache)", "warm (second session)"):
            wall, requests = _one_launch(root, agent)
            first = requests[0] if requests else (0, 0, float("nan"))
            print(
                f"{agent} {label}: first request {first[0]:,} tokens, {first[1]:,} loaded, "
                f"read in {first[2]:.1f} s; launch {wall:.0f} s; requests "
                + ", ".join(f"{p}/{c}/{s:.1f}s" for p, c, s in requests)
            )


def main() -> None:
    """Parse the subcommand and run it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("sizes")
    loading = commands.add_parser("load")
    loading.add_argument("--pair", default="starter")
    loading.add_argument("--tokens", type=int, default=4096)
    launching = commands.add_parser("launch")
    launching.add_argument("agents", nargs="+", choices=sorted(AGENT_ARGUMENTS))
    launching.add_argument(
        "--root", type=Path, default=Path(tempfile.gettempdir()) / "prefix-launch"
    )
    args = parser.parse_args()
    if args.command == "sizes":
        sizes()
    elif args.command == "load":
        load(args.pair, args.tokens)
    else:
        launch(args.agents, args.root)


if __name__ == "__main__":
    main()
