"""A plain line-by-line terminal chat: ``draftpen chat --plain`` (no full-screen UI).

A client of the engine, like the chat app: finds ``draftpen serve`` on its socket (or
starts one, and says so), stays attached, has it load the pair, then reads a message,
streams the reply (the engine reuses the cached prefix of earlier turns), prints the
statistics line and keeps the conversation. Ctrl+C stops a reply and keeps what was
written; Ctrl+D or /exit leaves. If the engine dies mid-reply, what it wrote is kept,
marked as interrupted, and a new engine is started.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading

from app.cli.reply_stream import ReplyStream
from app.cli.stats_line import format_stats
from app.client import ChatTurn, EngineClient, EngineLost, Loading, Waiting, ensure_engine
from app.errors import DraftpenError
from app.settings import Settings
from backends.base import ChatMessage
from backends.speculative import SpeculativeStats

HELP = "Type a message and press Enter. /new starts over, /exit (or Ctrl+D) leaves."
INTERRUPTED_NOTE = "[interrupted: the engine stopped]"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class EngineSession:
    """The engine this chat talks to: connected, attached, holding the pair."""

    def __init__(self, args: argparse.Namespace, settings: Settings, pair: str) -> None:
        self.args = args
        self.settings = settings
        self.pair = pair
        self.client: EngineClient | None = None
        self._attachment = contextlib.ExitStack()

    def start(self) -> EngineClient:
        """Connect (starting an engine if none runs), attach, load the pair."""
        self.close()
        options = ("--runtime", self.args.runtime) if self.args.runtime else ()
        client = ensure_engine(self.settings, on_status=_say, serve_options=options)
        self._attachment.enter_context(client.attach())
        _say(f"draftpen: loading {self.pair} ...")
        client.load(
            self.pair,
            on_progress=lambda text: _say(f"  {text}"),
            context_length=self.settings.context_length,
            exact=self.settings.exact_output,
        )
        self.client = client
        return client

    def close(self) -> None:
        """Let go of the engine (it stops by itself once idle, if we started it)."""
        self._attachment.close()
        self._attachment = contextlib.ExitStack()
        self.client = None


def run_plain_chat(args: argparse.Namespace, settings: Settings) -> int:
    """Chat until the user leaves; ``settings`` already carry this run's flags."""
    pair = args.pair or settings.default_pair
    session = EngineSession(args, settings, pair)
    client = session.start()
    system = settings.system_prompt
    messages: list[ChatMessage] = [ChatMessage("system", system)] if system else []
    _say(HELP)
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
                _say("(new chat)")
                continue
            messages.append(ChatMessage("user", text))
            turn = ChatTurn(
                pair=pair,
                messages=tuple(messages),
                params=settings.sampling_params(seed=args.seed),
                max_tokens=settings.max_tokens,
                drafter=settings.drafter,
                draft_tokens=settings.draft_tokens,
                fit_context=True,
                exact=settings.exact_output,
                stop=tuple(args.stop),
                thinking=settings.thinking,
            )
            pieces: list[str] = []
            try:
                stats = _stream_reply(client, turn, pieces)
            except EngineLost as error:
                # Keep what was written, say so, and carry on with a new engine.
                if pieces:
                    messages.append(ChatMessage("assistant", "".join(pieces)))
                else:
                    messages.pop()
                _say(f"\n{INTERRUPTED_NOTE} {error}\ndraftpen: starting the engine again ...")
                client = session.start()
                continue
            except DraftpenError as error:
                messages.pop()
                _say(f"\ndraftpen: {error}")
                continue
            messages.append(ChatMessage("assistant", "".join(pieces)))
            if stats is not None:
                _say(f"\n[{format_stats(stats)}]")
    finally:
        session.close()


def _stream_reply(
    client: EngineClient, turn: ChatTurn, pieces: list[str]
) -> SpeculativeStats | None:
    """Stream one reply's answer into ``pieces``; Ctrl+C stops it (the engine stops at
    its round). A thinking model's reasoning goes to stderr and never into ``pieces``:
    it does not go back into the conversation."""
    cancel = threading.Event()

    def stop_reply(signum: int, frame: object) -> None:
        cancel.set()

    previous = signal.signal(signal.SIGINT, stop_reply)
    stats = None
    stream = client.chat(turn, cancel)
    reply: ReplyStream | None = None
    try:
        for item in stream:
            if isinstance(item, Waiting):
                _say(f"(waiting for the engine: {item.position} ahead: {', '.join(item.ahead)})")
            elif isinstance(item, Loading):
                _say(f"(the engine is loading {turn.pair}: {item.text})")
            else:
                if reply is None:  # the stream knows the reasoning format from here
                    reply = ReplyStream(stream.reasoning)
                answered = len(reply.answer)
                reply.add(item)
                pieces.append(reply.answer[answered:])
                stats = item.stats
    finally:
        signal.signal(signal.SIGINT, previous)
    return stats
