"""The ``draftpen`` command: the door of the house, above every front end.

It parses the command line and hands each command to the front end that serves it:
``chat`` to the chat app (``app.tui``) or, with ``--plain``, the REPL (``app.cli``);
``generate``, ``models``, ``doctor`` and ``launch`` (agent CLIs) to ``app.cli``;
``serve`` to ``app.engine``; ``bench`` to ``app.bench``. Nothing imports this module.

Every command reports a failure as one line on stderr that says what to do, and
exits non-zero; tracebacks are for bugs, not for missing models or bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from app.bench import command as bench_command
from app.cli import cache as cache_command
from app.cli import doctor, generate, launch, worker
from app.cli import models as cli_models
from app.engine import command as server_command
from app.errors import DraftpenError
from app.options import (
    add_model_options,
    add_sampling_options,
    chat_settings,
)
from backends.errors import BackendError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def run_chat(args: argparse.Namespace) -> int:
    """``draftpen chat``: the chat app, or with ``--plain`` the line-by-line chat."""
    settings = chat_settings(args)
    if args.plain:
        from app.cli.repl import run_plain_chat

        return run_plain_chat(args, settings)
    from app.tui.launch import run_tui

    return run_tui(args, settings)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser."""
    parser = argparse.ArgumentParser(
        prog="draftpen",
        description="Local LLM chat, made fast by speculative decoding.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    chat = commands.add_parser(
        "chat",
        help="the chat app (the default command)",
        description="Chat with a model pair. Sampling flags override your settings for this run.",
    )
    add_model_options(chat)
    add_sampling_options(chat, temperature=None)
    chat.add_argument("--system", default=None, help="system prompt (default: from settings)")
    chat.add_argument(
        "--plain", action="store_true", help="a line-by-line chat instead of the full-screen app"
    )
    chat.set_defaults(func=run_chat)

    generate.register(commands)
    bench_command.register(commands)
    cli_models.register(commands)
    server_command.register(commands)
    doctor.register(commands)
    launch.register(commands)
    cache_command.register(commands)
    worker.register(commands)
    return parser


def _command_names(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``draftpen`` console script."""
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    # No command (or only options, like `draftpen --pair smollm2`) means chat.
    if not arguments or (
        arguments[0] not in _command_names(parser) and arguments[0] not in ("-h", "--help")
    ):
        arguments = ["chat", *arguments]
    args = parser.parse_args(arguments)
    try:
        # --target/--draft become a pair of this run before any front end looks for it.
        cli_models.apply_pair_options(args)
        return int(args.func(args))
    except (DraftpenError, BackendError) as error:
        print(f"draftpen: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("draftpen: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
