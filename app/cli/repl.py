"""A plain line-by-line terminal chat: ``draftpen chat --plain`` (no full-screen UI).

A client of the engine, like the chat app: finds ``draftpen serve`` on its socket (or
starts one, and says so), stays attached, has it load the pair, then reads a message,
streams the reply (the engine reuses the cached prefix of earlier turns), prints the
statistics line and keeps the conversation. When the chat outgrows the context, the
engine leaves out its oldest turns and a line says how many. Ctrl+C stops a reply and
keeps what was written; Ctrl+D or /exit leaves. If the engine dies mid-reply, what it
wrote is kept in the chat, marked as interrupted, and a new engine is started. If its
runtime crashed (a fatal signal), that is said with the fix; a second crash ends the
chat (exit status 1) instead of starting the engine a third time.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys

from app.cli.reply_stream import ReplyStream
from app.cli.stats_line import format_stats
from app.client import (
    CancelFlag,
    ChatTurn,
    EngineClient,
    EngineCrashedError,
    EngineError,
    EngineLost,
    EngineRuntimeRestartedError,
    Loading,
    Waiting,
    ensure_engine,
)
from app.errors import DraftpenError
from app.models.command_line_pairs import command_line_pair_files
from app.settings import Settings
from backends.base import ChatMessage
from backends.generation_events import SpeculativeStats

HELP = "Type a message and press Enter. /new starts over, /exit (or Ctrl+D) leaves."
INTERRUPTED_NOTE = "[interrupted: the engine stopped]"
CRASHED_NOTE = "[interrupted: the runtime crashed]"
RESTARTED_NOTE = "[interrupted: the engine's runtime restarted]"


def runtime_restarted_line(error: EngineRuntimeRestartedError) -> str:
    """``the engine's runtime restarted: <why>``, as a front end says it."""
    text = str(error)
    prefix = "The engine's runtime restarted: "
    if text.startswith(prefix):
        return "the engine's runtime restarted: " + text.removeprefix(prefix)
    return text


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
        """Connect (starting an engine if none runs), attach, load the pair.

        An engine whose runtime crashes while it loads is started once more; a second
        crash raises :class:`EngineCrashedError` (``gives_up``).
        """
        try:
            return self._start()
        except EngineCrashedError as error:
            if error.gives_up:
                raise
            _say(f"draftpen: {error}\ndraftpen: starting the engine again (once) ...")
            return self._start()

    def _start(self) -> EngineClient:
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
            # A --target/--draft pair is this process's: the engine learns it from its files.
            files=command_line_pair_files(self.pair),
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
    return PlainChat(args, settings).run()


class PlainChat:
    """One plain chat: the conversation so far (``messages``) and the engine it uses."""

    def __init__(self, args: argparse.Namespace, settings: Settings) -> None:
        self.args = args
        self.settings = settings
        self.pair = args.pair or settings.default_pair
        # Built once for the chat: each turn sends the same sampling.
        self.params = settings.sampling_params(seed=args.seed)
        self.session = EngineSession(args, settings, self.pair)
        system = settings.system_prompt
        self.system = [ChatMessage("system", system)] if system else []
        self.messages: list[ChatMessage] = list(self.system)

    def run(self) -> int:
        """Read messages and answer them until Ctrl+D or /exit (or the engine's runtime
        crashed twice: exit status 1)."""
        client: EngineClient | None = self.session.start()
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
                    self.messages = list(self.system)
                    _say("(new chat)")
                    continue
                client = self.answer(client, text)
                if client is None:
                    return 1
        finally:
            self.session.close()

    def answer(self, client: EngineClient, text: str) -> EngineClient | None:
        """Stream the reply to ``text`` and keep both in the conversation.

        Returns the client to use next: a new engine's when this one died mid-reply;
        None when no engine can be had (its runtime crashed twice: the chat ends).
        """
        messages = self.messages
        messages.append(ChatMessage("user", text))
        settings = self.settings
        turn = ChatTurn(
            pair=self.pair,
            messages=tuple(messages),
            params=self.params,
            max_tokens=settings.max_tokens,
            drafter=settings.drafter,
            draft_tokens=settings.draft_tokens,
            fit_context=True,
            exact=settings.exact_output,
            stop=tuple(self.args.stop),
            thinking=settings.thinking,
        )
        pieces: list[str] = []
        try:
            stats = _stream_reply(client, turn, pieces)
        except EngineRuntimeRestartedError as error:
            # The engine is still there and its runtime starts again by itself: keep
            # what was written, say why, and go on with the same engine.
            kept = _keep_partial_reply(messages, pieces)
            _say(f"\n{RESTARTED_NOTE} {runtime_restarted_line(error)}\n{kept}")
            return client
        except EngineLost as error:
            # Keep what was written, say so, and carry on with a new engine.
            kept = _keep_partial_reply(messages, pieces)
            crashed = isinstance(error, EngineCrashedError)
            note = CRASHED_NOTE if crashed else INTERRUPTED_NOTE
            _say(f"\n{note} {error}\n{kept}")
            if crashed and error.gives_up:
                return None  # the message said why: no third engine
            _say("draftpen: starting the engine again ...")
            try:
                return self.session.start()
            except EngineError as failure:  # it crashed again as it loaded, say
                _say(f"draftpen: {failure}")
                return None
        except DraftpenError as error:
            messages.pop()
            _say(f"\ndraftpen: {error}")
            return client
        messages.append(ChatMessage("assistant", "".join(pieces)))
        if stats is not None:
            _say(f"\n[{format_stats(stats)}]")
        return client


def left_out_line(count: int) -> str:
    """What the REPL says when the engine left out the oldest messages to fit its context."""
    noun = "message" if count == 1 else "messages"
    return (
        f"(the chat no longer fits the model's context: the {count} oldest {noun} were left "
        "out, and the model does not see them; /new starts a new chat)"
    )


def _stream_reply(
    client: EngineClient, turn: ChatTurn, pieces: list[str]
) -> SpeculativeStats | None:
    """Stream one reply's answer into ``pieces``; Ctrl+C stops it (the engine stops at
    its round). A thinking model's reasoning goes to stderr and never into ``pieces``:
    it does not go back into the conversation."""
    cancel = CancelFlag()

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
                    if stream.left_out_messages:
                        _say(left_out_line(stream.left_out_messages))
                answered = len(reply.answer)
                reply.add(item)
                pieces.append(reply.answer[answered:])
                stats = item.stats
    finally:
        signal.signal(signal.SIGINT, previous)
    return stats


def _keep_partial_reply(messages: list[ChatMessage], pieces: list[str]) -> str:
    """After a reply the engine could not finish: keep what it wrote as the assistant's
    turn, or drop the unanswered message when it wrote nothing; the line that says so."""
    if pieces:
        messages.append(ChatMessage("assistant", "".join(pieces)))
        return "What it wrote is kept in the chat."
    messages.pop()
    return "It wrote nothing; send your message again."
