"""The ``draftpen`` command: chat (default), generate, bench, models, serve, doctor.

Every command reports a failure as one line on stderr that says what to do, and
exits non-zero; tracebacks are for bugs, not for missing models or bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
from collections.abc import Sequence

from app import cli_models, cli_serve, doctor
from app.errors import DraftpenError
from app.settings import Settings, load_settings
from backends.base import ChatMessage
from backends.engine import DRAFTER_CHOICES, GenerationRequest
from backends.errors import BackendError
from backends.sampling import SamplingParams
from backends.select import RUNTIMES
from backends.speculative import FINISH_CANCELLED, SpeculativeStats

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that loads a pair."""
    parser.add_argument(
        "--pair", default=None, help="model pair from the catalog (default: from settings)"
    )
    parser.add_argument("--context", type=int, default=None, help="context length in tokens")
    parser.add_argument(
        "--runtime",
        default=None,
        choices=("auto", *RUNTIMES),
        help="inference runtime (default: best for this machine; see draftpen doctor)",
    )


def add_sampling_options(parser: argparse.ArgumentParser, *, temperature: float | None) -> None:
    """Sampling and drafting options shared by generate and chat.

    ``temperature=None`` makes every default None: the chat fills them from the
    user's settings, so a flag overrides a setting for this run only.
    """
    from_settings = temperature is None

    def default(value: object) -> object:
        return None if from_settings else value

    parser.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    parser.add_argument(
        "--top-k", type=int, default=default(0), help="keep the k likeliest tokens (0: off)"
    )
    parser.add_argument("--top-p", type=float, default=default(1.0), help="nucleus mass to keep")
    parser.add_argument(
        "--min-p", type=float, default=default(0.0), help="drop tokens below min-p x best"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    parser.add_argument(
        "--max-tokens", type=int, default=default(512), help="most tokens to generate"
    )
    parser.add_argument(
        "--draft-tokens",
        "-k",
        type=int,
        default=default(4),
        help="draft tokens per round (K) for a fixed drafter; auto chooses K itself",
    )
    parser.add_argument("--drafter", choices=DRAFTER_CHOICES, default=default("auto"))
    parser.add_argument(
        "--exact",
        dest="exact_output",
        action=argparse.BooleanOptionalAction,
        default=default(False),
        help="greedy output bit-identical to plain decoding: exact kernels (on a CPU "
        "a 2k-token prompt reads 2.4x slower) and auto verifies only in batches that round "
        "like one-token decoding; --no-exact (default) uses the fastest kernels",
    )
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


# Chat flags that override the settings field of the same name for one run.
CHAT_SETTING_FLAGS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_tokens",
    "draft_tokens",
    "drafter",
    "exact_output",
)


def chat_settings(args: argparse.Namespace) -> Settings:
    """The user's settings with this run's chat flags applied (never saved)."""
    settings = load_settings()
    overrides = {name: getattr(args, name) for name in CHAT_SETTING_FLAGS}
    overrides = {name: value for name, value in overrides.items() if value is not None}
    if getattr(args, "system", None) is not None:
        overrides["system_prompt"] = args.system
    if getattr(args, "context", None) is not None:
        overrides["context_length"] = args.context
    return dataclasses.replace(settings, **overrides)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """SamplingParams from parsed options; a bad value is a one-line error."""
    try:
        return SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            seed=args.seed,
        )
    except ValueError as error:
        raise DraftpenError(f"invalid sampling option: {error}") from error


def format_stats(stats: SpeculativeStats) -> str:
    """The one-line summary printed after a generation."""
    return (
        f"{stats.generated_tokens} tokens, {stats.decode_tokens_per_second:.1f} tok/s "
        f"(prefill {stats.prompt_tokens - stats.cached_prompt_tokens} tokens in "
        f"{stats.prefill_seconds:.2f}s, first token after {stats.time_to_first_token:.2f}s) | "
        f"drafted {stats.drafted}, accepted {stats.accepted} "
        f"({stats.acceptance_rate:.0%}), mean accepted length "
        f"{stats.mean_accepted_length:.2f} | target passes {stats.target_passes}, "
        f"draft passes {stats.draft_passes}"
    )


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.prompt != "-":
        return args.prompt
    if sys.stdin.isatty():
        raise DraftpenError("Give a prompt with --prompt TEXT or on standard input.")
    return sys.stdin.read()


def _interrupt_sets(cancel: threading.Event) -> None:
    """Make Ctrl+C stop generation between rounds instead of killing the process."""

    def handler(signum: int, frame: object) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    signal.signal(signal.SIGINT, handler)


def run_generate(args: argparse.Namespace) -> int:
    """``draftpen generate``: stream one answer to stdout, statistics to stderr."""
    from app.loading import load_engine
    from app.settings import load_settings

    settings = load_settings()
    prompt = _read_prompt(args)
    params = sampling_params(args)
    if args.max_tokens < 1 or args.draft_tokens < 0:
        raise DraftpenError("--max-tokens must be at least 1 and --draft-tokens at least 0")
    engine = load_engine(
        args.pair or settings.default_pair,
        n_ctx=args.context or settings.context_length,
        runtime=args.runtime,
        with_draft=args.drafter in ("auto", "model"),
        calibrate=args.drafter == "auto",
        exact_output=args.exact_output,
    )
    try:
        if args.raw:
            prompt_tokens = engine.text_prompt(prompt)
        else:
            messages = [ChatMessage("user", prompt)]
            if args.system:
                messages.insert(0, ChatMessage("system", args.system))
            prompt_tokens = engine.chat_prompt(messages)
        request = GenerationRequest(
            prompt_tokens=tuple(prompt_tokens),
            params=params,
            max_tokens=args.max_tokens,
            drafter=args.drafter,
            draft_tokens=args.draft_tokens,
            stop=tuple(args.stop),
            exact=args.exact_output,
        )
        cancel = threading.Event()
        _interrupt_sets(cancel)
        pieces: list[str] = []
        last = None
        decision = ""
        for event in engine.generate(request, cancel):
            pieces.append(event.text)
            if not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            last = event
            decision = event.decision or decision
    finally:
        engine.close()
    assert last is not None
    if args.json:
        json.dump(
            {
                "text": "".join(pieces),
                "finish_reason": last.finish_reason,
                "stats": last.stats.as_dict(),
                "decision": decision,
            },
            sys.stdout,
        )
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n")
        print(format_stats(last.stats), file=sys.stderr)
        if decision:
            print(f"drafter choice (auto): {decision}", file=sys.stderr)
    return EXIT_INTERRUPTED if last.finish_reason == FINISH_CANCELLED else 0


def run_bench(args: argparse.Namespace) -> int:
    """``draftpen bench``: does speculation pay on this machine?"""
    from app.bench import run_benchmark

    return run_benchmark(args)


def run_chat(args: argparse.Namespace) -> int:
    """``draftpen chat``: the chat app, or with ``--plain`` the line-by-line chat."""
    settings = chat_settings(args)
    if args.plain:
        from app.chat_repl import run_plain_chat

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

    generate = commands.add_parser("generate", help="answer one prompt, streamed to stdout")
    add_model_options(generate)
    add_sampling_options(generate, temperature=0.0)
    generate.add_argument(
        "--prompt", "-p", default=None, help="prompt text ('-' or omitted: stdin)"
    )
    mode = generate.add_mutually_exclusive_group()
    mode.add_argument(
        "--chat", dest="raw", action="store_false", help="apply the chat template (default)"
    )
    mode.add_argument(
        "--raw", dest="raw", action="store_true", help="send the prompt text as it is"
    )
    generate.add_argument("--system", default=None, help="system prompt (chat mode)")
    generate.add_argument("--json", action="store_true", help="print one JSON object at the end")
    generate.set_defaults(func=run_generate, raw=False)

    bench = commands.add_parser("bench", help="measure whether speculation pays on this machine")
    add_model_options(bench)
    bench.add_argument(
        "--no-yardsticks",
        action="store_true",
        help="skip llama-cpp-python's own decoders (saves memory and time)",
    )
    bench.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="load exact kernels and add an 'auto, exact' mode (default: the exact_output setting)",
    )
    bench.add_argument(
        "--modes",
        default=None,
        help="compare only these, comma-separated: draft, ngram, auto, reference "
        "(llama-cpp-python's decoders); plain always runs (default: all)",
    )
    bench.add_argument("--max-tokens", type=int, default=128, help="tokens per generation")
    bench.add_argument("--repeats", type=int, default=1, help="alternating repeats per prompt")
    bench.add_argument("--category", action="append", default=[], help="only these categories")
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.add_argument("--output", default=None, help="also write the JSON results to this file")
    bench.set_defaults(func=run_bench)

    cli_models.register(commands)
    cli_serve.register(commands)
    doctor.register(commands)
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
        return int(args.func(args))
    except (DraftpenError, BackendError) as error:
        print(f"draftpen: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("draftpen: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
