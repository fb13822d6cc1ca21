"""``draftpen generate``: answer one prompt, the text to stdout and the figures to stderr."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from app.cli.stats_line import format_stats
from app.errors import DraftpenError
from app.options import add_model_options, add_sampling_options, sampling_params
from backends.base import ChatMessage
from backends.engine import GenerationRequest
from backends.speculative import FINISH_CANCELLED

EXIT_INTERRUPTED = 130


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``generate`` to the ``draftpen`` command."""
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
