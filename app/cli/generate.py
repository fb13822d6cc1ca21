"""``draftpen generate``: answer one prompt, the text to stdout and the figures to stderr.

It loads the pair in this process (what it measures is the loop itself), unless
``--engine`` asks the engine (``draftpen serve``, started if none runs) to answer: then
the pair the engine holds is used and nothing is loaded here.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator

from app.cli.reply_stream import ReplyStream
from app.cli.stats_line import format_stats
from app.errors import DraftpenError
from app.options import add_model_options, add_sampling_options, sampling_params
from app.settings import Settings
from backends.base import ChatMessage
from backends.engine import GenerationRequest
from backends.generation_events import FINISH_CANCELLED, GenerationEvent
from backends.output.reasoning import ReasoningFormat
from backends.sampling.filters import SamplingParams
from backends.speculation.cost_audit import COSTS_NOTE_PREFIX

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
    generate.add_argument(
        "--engine",
        action="store_true",
        help="ask the engine (draftpen serve; started if none runs) instead of loading the "
        "pair in this process",
    )
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
    from app.models.catalog import DRAFTER_KINDS
    from app.settings import load_settings

    settings = load_settings()
    prompt = _read_prompt(args)
    params = sampling_params(args)
    if args.max_tokens < 1 or args.draft_tokens < 0:
        raise DraftpenError("--max-tokens must be at least 1 and --draft-tokens at least 0")
    if args.engine:
        return _report(args, *_events_from_engine(args, settings, prompt, params))
    engine = load_engine(
        args.pair or settings.default_pair,
        n_ctx=args.context or settings.context_length,
        runtime=args.runtime,
        # A head (EAGLE-3, DFlash, DSpark, or an MTP head in a file of its own, as Gemma
        # 4's assistant) is loaded with the pair's other files (it is no draft model).
        with_draft=args.drafter in ("auto", *DRAFTER_KINDS),
        calibrate=args.drafter == "auto",
        exact_output=args.exact_output,
    )
    thinking = args.thinking if args.thinking is not None else settings.thinking
    try:
        reasoning = None
        if args.raw:
            prompt_tokens = engine.text_prompt(prompt)
        else:
            messages = [ChatMessage("user", prompt)]
            if args.system:
                messages.insert(0, ChatMessage("system", args.system))
            prompt_text = engine.chat_prompt_text(messages, thinking=thinking)
            prompt_tokens = engine.text_prompt(prompt_text)
            reasoning = engine.reasoning_format(prompt_text)
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
        # A thinking model's reasoning goes to stderr (or "reasoning" in --json).
        return _report(args, engine.generate(request, cancel), lambda: reasoning)
    finally:
        engine.close()


def _events_from_engine(
    args: argparse.Namespace, settings: Settings, prompt: str, params: SamplingParams
) -> tuple[Iterator[GenerationEvent], Callable[[], ReasoningFormat | None]]:
    """The answer's events from the engine (its notices go to stderr), and how its
    reasoning is marked (known once the first event has arrived)."""
    from app.client import (
        CancelFlag,
        ChatTurn,
        EngineLost,
        EngineRuntimeRestartedError,
        Loading,
        Waiting,
        ensure_engine,
    )
    from app.models.command_line_pairs import command_line_pair_files

    if args.raw:
        raise DraftpenError("--engine answers chat prompts only; leave out --raw.")
    pair = args.pair or settings.default_pair
    client = ensure_engine(settings, on_status=_note)
    # A --target/--draft pair is this process's: the engine learns it from its files
    # with a load, before the chat names it.
    files = command_line_pair_files(pair)
    if args.context is not None or files is not None:
        client.load(pair, on_progress=_note, context_length=args.context, files=files)
    messages = [ChatMessage("user", prompt)]
    if args.system:
        messages.insert(0, ChatMessage("system", args.system))
    turn = ChatTurn(
        pair,
        tuple(messages),
        params,
        max_tokens=args.max_tokens,
        drafter=args.drafter,
        draft_tokens=args.draft_tokens,
        fit_context=False,
        exact=args.exact_output,
        stop=tuple(args.stop),
        thinking=args.thinking if args.thinking is not None else settings.thinking,
    )
    cancel = CancelFlag()
    _interrupt_sets(cancel)
    stream = client.chat(turn, cancel)

    def events() -> Iterator[GenerationEvent]:
        answered = False
        try:
            for item in stream:
                if isinstance(item, Waiting):
                    _note(f"waiting behind {', '.join(item.ahead)}")
                elif isinstance(item, Loading):
                    _note(item.text)
                else:
                    answered = True
                    yield item
        except (EngineLost, EngineRuntimeRestartedError):
            # The engine, or its runtime, died mid-answer: end the answer's line, so
            # the error that follows on stderr starts on its own.
            if answered and not args.json:
                print(flush=True)
            raise

    return events(), lambda: stream.reasoning


def _note(text: str) -> None:
    print(f"draftpen: {text}", file=sys.stderr, flush=True)


def _report(
    args: argparse.Namespace,
    events: Iterable[GenerationEvent],
    reasoning: Callable[[], ReasoningFormat | None],
) -> int:
    """Stream the answer to stdout and any reasoning to stderr (or collect both for
    --json), then the figures. ``reasoning`` is asked once the first event is in."""
    reply: ReplyStream | None = None
    last = None
    decision = costs_note = ""
    for event in events:
        if reply is None:
            reply = ReplyStream(reasoning(), echo=not args.json)
        reply.add(event)
        last = event
        decision = event.decision or decision
        costs_note = event.costs_note or costs_note
    if last is None or reply is None:
        raise DraftpenError("The answer was cancelled before it began.")
    if args.json:
        json.dump(
            {
                "text": reply.answer,
                "reasoning": reply.reasoning_text,
                "reasoning_tokens": reply.reasoning_tokens,
                "finish_reason": last.finish_reason,
                "stats": last.stats.as_dict(),
                "decision": decision,
                "costs_note": costs_note,
            },
            sys.stdout,
        )
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n")
        print(format_stats(last.stats), file=sys.stderr)
        if decision:
            print(f"drafter choice (auto): {decision}", file=sys.stderr)
        if costs_note:
            print(f"{COSTS_NOTE_PREFIX}{costs_note}", file=sys.stderr)
    cancelled = last.finish_reason in (FINISH_CANCELLED, None)  # None: the stream was closed
    return EXIT_INTERRUPTED if cancelled else 0
