"""``draftpen launch claude|codex|opencode``: a coding agent's own CLI, answered locally.

As ``ollama launch`` does: find the engine on TCP, or start one (``draftpen serve
--idle-exit --tcp 127.0.0.1:0``, a free loopback port, the API key required); load the
pair with a context its prompts fit in; then run the agent's CLI, found on PATH, with
the user's arguments unchanged and the settings it needs (base URL, key, model) given
for this run only: environment variables and command-line overrides, never a change to
the user's own config files. launch stays attached to the engine while the CLI runs, so
an engine it started does not stop under a long session, and exits with the CLI's
status. If the engine goes away meanwhile (its runtime crashed), launch says why at once
and again after the CLI exits: the CLI only sees its requests refused.

Each CLI takes its settings its own way: app/cli/agent_settings.py says how.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx

from app.cli.agent_settings import AGENTS, AgentCli, Endpoint, LaunchPlan, agent_plan
from app.client import EngineClient, EngineLost, ensure_engine, find_engine
from app.client.api_key import API_KEY_ENV, engine_api_key
from app.client.wire import default_socket_path
from app.errors import DraftpenError
from app.models.command_line_pairs import command_line_pair_files
from app.settings import load_settings

# What a shell says for a command it cannot find: launch says the same for a missing CLI.
EXIT_NOT_INSTALLED = 127
# Where launch starts an engine of its own when the one on the default socket runs
# without TCP (started by the chat app): beside that socket, in the same private dir.
AGENTS_SOCKET_NAME = "agents.sock"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``launch`` command."""
    launch = subparsers.add_parser(
        "launch",
        help="run Claude Code, Codex CLI or opencode against the local engine",
        description="Run an agent CLI (found on PATH) with the local engine as its model: "
        "the engine is found or started on TCP with its API key, the pair is loaded with "
        "a context the agent's prompts fit in, and the CLI gets the URL, the key and the "
        "model for this run only (your own config files are not changed). Arguments "
        "after -- go to the CLI unchanged; launch exits with its status.",
        epilog="examples: draftpen launch claude; draftpen launch codex -- exec 'fix the "
        "tests'; draftpen launch opencode --pair starter -- run 'What is 2+3?'",
    )
    launch.add_argument("agent", choices=sorted(AGENTS), help="the agent CLI to run")
    launch.add_argument(
        "arguments",
        nargs=argparse.REMAINDER,
        metavar="[--pair P] [--context N] [-- ARGS...]",
        help="--pair: the pair to load (default: your default pair); --context: its "
        "context in tokens (default: 32768 for claude, 16384 for codex and opencode, "
        "less if the model was trained on less); ARGS go to the CLI",
    )
    launch.set_defaults(func=run_launch)


def split_arguments(arguments: Sequence[str]) -> tuple[str | None, int | None, list[str]]:
    """launch's own ``--pair`` and ``--context``, and the CLI's arguments.

    Before a ``--`` every argument must be launch's; without one, launch's options are
    the leading ones and the rest is the CLI's (``launch codex exec hi``).
    """
    values: dict[str, str] = {}
    rest = list(arguments)
    explicit = "--" in rest
    ours = rest[: rest.index("--")] if explicit else rest
    index = 0
    while index < len(ours):
        word = ours[index]
        name, equals, value = word.partition("=")
        if name not in ("--pair", "--context"):
            if explicit:
                raise DraftpenError(
                    f"draftpen launch takes --pair and --context before '--', not {word!r}; "
                    "the agent's own arguments go after '--'."
                )
            break
        if not equals:
            if index + 1 >= len(ours):
                raise DraftpenError(f"{name} needs a value, such as {name} 16384.")
            value = ours[index + 1]
            index += 1
        values[name] = value
        index += 1
    theirs = rest[rest.index("--") + 1 :] if explicit else rest[index:]
    context = values.get("--context")
    if context is not None and (not context.isdigit() or int(context) < 256):
        raise DraftpenError(f"--context wants a number of tokens (256 or more), not {context!r}.")
    return values.get("--pair"), int(context) if context else None, theirs


class CliNotInstalledError(DraftpenError):
    """The agent's CLI is not on PATH."""


def find_cli(agent: AgentCli, path: str | None = None) -> str:
    """The agent's executable on PATH; an error with its install command if there is none."""
    found = shutil.which(agent.executable, path=path)
    if found is None:
        raise CliNotInstalledError(
            f"{agent.title} is not installed: there is no `{agent.executable}` on PATH. "
            f"Install it with `{agent.install_command}` (Node.js 18 or newer), then run "
            f"`draftpen launch {agent.name}` again."
        )
    return found


def run_launch(args: argparse.Namespace) -> int:
    """``draftpen launch AGENT``: find or start the engine, load the pair, run the CLI."""
    agent = AGENTS[args.agent]
    pair, context, arguments = split_arguments(args.arguments)
    try:
        executable = find_cli(agent)
    except CliNotInstalledError as error:
        print(f"draftpen: {error}", file=sys.stderr)
        return EXIT_NOT_INSTALLED
    settings = load_settings()
    pair = pair or settings.default_pair
    wanted = context or _agent_context(agent, pair)
    client, endpoint = prepare_engine(pair, wanted, report=_status)
    plan = agent_plan(agent, executable, endpoint, arguments, os.environ)
    _status(f"running {agent.title} on '{pair}' ({endpoint.url}, {endpoint.context} tokens)")
    lost: list[EngineLost] = []

    def engine_gone(error: EngineLost) -> None:
        # The CLI only sees its connections refused; this is where the user learns why.
        lost.append(error)
        _status(f"{error} {agent.title} cannot reach it until you launch it again.")

    with client.attach(on_lost=engine_gone):
        status = run_cli(plan)
    if not lost:  # the CLI may have ended before the watcher read the engine's end
        try:
            client.health()
        except EngineLost as error:
            lost.append(error)
    if lost:  # said again where a full-screen CLI cannot have drawn over it
        _status(f"the engine went away during this session: {lost[0]}")
    return status


def prepare_engine(
    pair: str,
    context: int,
    *,
    report: Callable[[str], None],
    socket_path: Path | None = None,
    serve_options: Sequence[str] = (),
) -> tuple[EngineClient, Endpoint]:
    """An engine on TCP holding ``pair`` with at least ``context`` tokens, and its URL.

    The engine on the socket is used when it listens on TCP; when none runs, one is
    started there with TCP; when one runs without TCP (the chat app started it), an
    engine for agents is started beside it. ``serve_options`` go to a started engine.
    """
    key = engine_api_key()
    path = socket_path or default_socket_path()
    client = find_engine(path)
    tcp_options = ["--tcp", "127.0.0.1:0", "--context", str(context), *serve_options]
    if client is None or client.health().tcp is None:
        if client is not None:
            path = path.parent / AGENTS_SOCKET_NAME
            report(
                f"the engine on {client.socket_path} does not listen on TCP; using one for "
                f"agents on {path} (each engine holds its own copy of a pair it loads)"
            )
        client = ensure_engine(
            load_settings(), on_status=report, socket_path=path, serve_options=tcp_options
        )
    health = client.health()
    if health.tcp is None:
        raise DraftpenError(
            f"The engine on {client.socket_path} (pid {health.pid}) does not listen on TCP, "
            "so agent CLIs cannot reach it. Stop it, or start it with "
            "`draftpen serve --tcp 127.0.0.1:PORT`, and run launch again."
        )
    url = _reachable(health.tcp)
    _check_key(url, key.value, key.source)
    held = {loaded.pair: loaded.context_length for loaded in health.loaded}
    if held.get(pair, 0) >= context:
        context = held[pair]
    else:
        report(f"loading '{pair}' with a {context}-token context")
        files = command_line_pair_files(pair)  # a --target pair: the engine never saw it
        context = client.load(
            pair, on_progress=report, context_length=context, files=files
        ).context_length
    return client, Endpoint(url, key.value, pair, context)


def run_cli(plan: LaunchPlan) -> int:
    """Run the CLI in the foreground; its exit status (128 + N after signal N)."""
    process = subprocess.Popen(plan.command, env=plan.environment)
    # Ctrl+C reaches the CLI (same process group), which decides what it means; launch
    # waits for it rather than dying first. A SIGTERM to launch is passed on.
    with _ignoring_interrupts(process):
        status = process.wait()
    return 128 - status if status < 0 else status


@contextlib.contextmanager
def _ignoring_interrupts(process: subprocess.Popen[bytes]) -> Iterator[None]:
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: process.terminate())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)


def _agent_context(agent: AgentCli, pair: str) -> int:
    """The agent's context, or the pair's trained context where that is smaller."""
    trained = trained_context(pair)
    if trained is not None and trained < agent.context:
        _status(
            f"'{pair}' was trained on {trained} tokens, less than {agent.title}'s usual "
            f"{agent.context}: loading it with {trained}"
        )
        return trained
    return agent.context


def trained_context(pair: str) -> int | None:
    """The context the pair's target model was trained on, from its files; None if unknown."""
    from app.models.gguf_header import read_gguf_header
    from app.models.pair_files import pair_files

    try:
        target = pair_files(pair).target_path
        if target.is_dir():  # an MLX model: its Hugging Face config
            config = json.loads((target / "config.json").read_text(encoding="utf-8"))
            value = config.get("max_position_embeddings")
        else:
            header = read_gguf_header(target)
            value = header.metadata.get(f"{header.architecture}.context_length")
    except (DraftpenError, OSError, ValueError):
        return None  # not downloaded, or unreadable: loading it will say so
    return int(value) if isinstance(value, int) and value > 0 else None


def _reachable(url: str) -> str:
    """The engine's URL as a local client reaches it (a wildcard address is not one)."""
    return url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:")


def _check_key(url: str, key: str, source: str) -> None:
    """Fail now, clearly, if the engine wants another key than the one launch passes."""
    try:
        answer = httpx.get(
            f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
    except httpx.HTTPError as error:
        raise DraftpenError(f"Cannot reach the engine at {url}: {error}.") from error
    if answer.status_code == 401:
        raise DraftpenError(
            f"The engine at {url} was started with another API key than the one in "
            f"{source}. Set {API_KEY_ENV} to the key it was started with (serve --api-key), "
            "or stop it and let launch start one."
        )


def _status(text: str) -> None:
    print(f"draftpen launch: {text}", file=sys.stderr, flush=True)
