"""A plain line-by-line terminal chat: ``draftpen chat --plain`` (no full-screen UI).

Reads a message, streams the reply through the shared loop, prints the statistics
line, keeps the conversation (the loop reuses the cached prefix of earlier turns).
Ctrl+C stops a reply and keeps what was written; Ctrl+D or /exit leaves.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from app.cli.stats_line import format_stats
from app.errors import DraftpenError
from app.settings import Settings
from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.errors import BackendError
from backends.speculative import SpeculativeStats

HELP = "Type a message and press Enter. /new starts over, /exit (or Ctrl+D) leaves."


def run_plain_chat(args: argparse.Namespace, settings: Settings) -> int:
    """Chat until the user leaves; ``settings`` already carry this run's flags."""
    from app.loading import load_engine

    pair = args.pair or settings.default_pair
    params = settings.sampling_params(seed=args.seed)
    print(f"draftpen: loading {pair} ...", file=sys.stderr)
    engine = load_engine(
        pair,
        n_ctx=settings.context_length,
        runtime=args.runtime,
        with_draft=settings.drafter in ("auto", "model"),
        calibrate=settings.drafter == "auto",
        exact_output=settings.exact_output,
        on_progress=lambda message: print(f"  {message}", file=sys.stderr),
    )
    system = settings.system_prompt
    messages: list[ChatMessage] = [ChatMessage("system", system)] if system else []
    print(HELP, file=sys.stderr)
    try:
        while True:
            try:
                line = input("\n> ")
            except EOFError:
                print()
                return 0
            text = line.strip()
            if not text:
                continue
            if text == "/exit":
                return 0
            if text == "/new":
                messages = messages[:1] if system else []
                print("(new chat)", file=sys.stderr)
                continue
            messages.append(ChatMessage("user", text))
            try:
                request = GenerationRequest(
                    prompt_tokens=tuple(engine.chat_prompt(messages)),
                    params=params,
                    max_tokens=settings.max_tokens,
                    drafter=settings.drafter,
                    draft_tokens=settings.draft_tokens,
                    stop=tuple(args.stop),
                    exact=settings.exact_output,
                )
                reply, stats = _stream_reply(engine, request)
            except (BackendError, DraftpenError) as error:
                messages.pop()
                print(f"\ndraftpen: {error}", file=sys.stderr)
                continue
            messages.append(ChatMessage("assistant", reply))
            print(f"\n[{format_stats(stats)}]", file=sys.stderr)
    finally:
        engine.close()


def _stream_reply(engine: Engine, request: GenerationRequest) -> tuple[str, SpeculativeStats]:
    """Stream one reply; Ctrl+C stops it at the end of the current round."""
    cancel = threading.Event()

    def stop_reply(signum: int, frame: object) -> None:
        cancel.set()

    previous = signal.signal(signal.SIGINT, stop_reply)
    pieces: list[str] = []
    last = None
    try:
        for event in engine.generate(request, cancel):
            pieces.append(event.text)
            sys.stdout.write(event.text)
            sys.stdout.flush()
            last = event
    finally:
        signal.signal(signal.SIGINT, previous)
    assert last is not None
    return "".join(pieces), last.stats
