"""The chat app's CPU while a reply streams at a fixed rate, with no model running.

``ui_cost.py`` measures what matters (the decode rate beside the app), but on a shared
machine its rates swing with other people's work. This script measures the cause
instead, steadily: a stand-in engine (a subprocess speaking the engine's stream
protocol over a Unix socket, at almost no CPU) sends a fixed Markdown reply at a fixed
token rate, and the real app (Textual, headless, driven by its pilot) shows it with
Markdown and with draft colours. Reported per run: the CPU of the app's UI thread and
of its whole process (the stream worker included) per second of streaming, and how
many times Textual laid the screen out and painted it.

    python benchmarks/ui_replay.py --rate 30 --repeats 3 [--tree PATH]

``--tree`` runs another checkout's ``app``/``backends`` (e.g. a ``git archive``), so
before and after can be compared in one session.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PAIR = "replay"
PROMPT = "Explain how a hash map works, then show a small Python class implementing one."
REPLY = """A hash map stores key-value pairs in an array of *buckets*. To find where a key \
goes, it computes the key's hash, a fixed-size integer, and takes it modulo the number \
of buckets. Lookups, inserts and deletes then touch one bucket, so on average they take \
constant time.

Two keys can land in the same bucket: a *collision*. With **separate chaining** every \
bucket holds a small list of the pairs that hashed there, and an operation walks that \
list comparing keys. With open addressing the map instead probes other slots until it \
finds a free one.

When the map fills up, the chains get long and operations slow down. So the map tracks \
its *load factor* (entries divided by buckets) and, past a threshold such as 0.75, \
allocates twice as many buckets and reinserts every pair.

Here is a small implementation with separate chaining:

```python
class HashMap:
    def __init__(self, buckets=8):
        self._buckets = [[] for _ in range(buckets)]
        self._size = 0

    def _bucket(self, key):
        return self._buckets[hash(key) % len(self._buckets)]

    def put(self, key, value):
        bucket = self._bucket(key)
        for index, (existing, _) in enumerate(bucket):
            if existing == key:
                bucket[index] = (key, value)
                return
        bucket.append((key, value))
        self._size += 1
        if self._size > 0.75 * len(self._buckets):
            self._grow()

    def get(self, key, default=None):
        for existing, value in self._bucket(key):
            if existing == key:
                return value
        return default

    def _grow(self):
        pairs = [pair for bucket in self._buckets for pair in bucket]
        self._buckets = [[] for _ in range(2 * len(self._buckets))]
        self._size = 0
        for key, value in pairs:
            self.put(key, value)
```

Each `put` replaces the value of a key that is already there, so a key is stored once. \
Python's own `dict` uses open addressing with a compact array of entries, which keeps \
iteration in insertion order and uses less memory than lists of tuples.
"""


def tokens_of(text: str) -> list[str]:
    """The reply cut into token-sized pieces (a word, its space, or up to 4 characters)."""
    pieces: list[str] = []
    word = ""
    for char in text:
        if char.isalnum() or char == "_":
            word += char
            if len(word) == 4:
                pieces.append(word)
                word = ""
        else:
            if word:
                pieces.append(word)
                word = ""
            if pieces and pieces[-1] == " " * len(pieces[-1]) and char == " ":
                pieces[-1] += char  # runs of indentation are one token
            else:
                pieces.append(char)
    if word:
        pieces.append(word)
    return pieces


# -- the stand-in engine (run as a subprocess: --serve SOCKET) -------------------------


def _stats(generated: int, seconds: float) -> dict[str, Any]:
    drafted = generated // 2
    return {
        "prompt_tokens": 40,
        "generated_tokens": generated,
        "rounds": generated,
        "speculative_rounds": generated // 4,
        "drafted": drafted,
        "accepted": drafted // 2,
        "target_passes": generated,
        "decode_seconds": round(seconds, 4),
        "drafter": "ngram",
        "draft_length": 3,
        "estimated_speedup": 1.1,
    }


async def _reply(writer: asyncio.StreamWriter, rate: float, limit: int) -> None:
    pieces = tokens_of(REPLY)[:limit]
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
    started = time.monotonic()
    for index, piece in enumerate(pieces):
        due = started + (index + 1) / rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        last = index == len(pieces) - 1
        extra = _stats(index + 1, (index + 1) / rate)
        # Every third token "from the draft", in runs, so tints make styled spans.
        extra["segments"] = [[piece, index % 6 >= 3]]
        extra["reasoning"] = None
        choice = {"index": 0, "delta": {}, "finish_reason": "length" if last else None}
        chunk = {"choices": [choice], "draftpen": extra}
        writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await writer.drain()
    writer.write(b"data: [DONE]\n\n")
    await writer.drain()


def _loaded() -> dict[str, Any]:
    return {
        "pair": PAIR,
        "target": "replay.gguf",
        "draft": None,
        "context_length": 4096,
        "exact": False,
        "idle_seconds": 0.0,
    }


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rate: float, limit: int
) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    request_line, *header_lines = head.decode().split("\r\n")
    method, path, _ = request_line.split(" ", 2)
    length = 0
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    try:
        if path == "/v1/chat/completions":
            await _reply(writer, rate, limit)
        elif path == "/draftpen/load":
            body = b"data: " + json.dumps({"draftpen": {"loaded": _loaded()}}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close"
                b"\r\n\r\n" + body + b"\n\ndata: [DONE]\n\n"
            )
        elif path == "/draftpen/attach":
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
            await writer.drain()
            await reader.read()  # held until the app goes
        else:
            body = json.dumps({"error": {"message": f"{method} {path}: not replayed"}}).encode()
            writer.write(
                b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
            )
            writer.write(body)
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _serve(socket_path: Path, rate: float, limit: int) -> None:
    server = await asyncio.start_unix_server(
        lambda reader, writer: _handle(reader, writer, rate, limit), path=os.fspath(socket_path)
    )
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


# -- the app, measured -------------------------------------------------------------


class Counting:
    """Counts and times (UI thread CPU) Textual's screen layouts and paints, the chat
    screen's redraw tick and its history saves, by wrapping the methods of both trees."""

    def __init__(self) -> None:
        from textual.screen import Screen

        from app.chats.history import History
        from app.tui.screens.reply_writing import ReplyWritingScreen

        self.counts: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._wrapped: list[tuple[Any, str, Any]] = []
        # Paints inside a layout are counted as the layout's.
        self._wrap(Screen, "_refresh_layout", "layout")
        self._wrap(Screen, "_compositor_refresh", "paint")
        self._wrap(History, "update_message", "save")
        self._wrap(ReplyWritingScreen, "_refresh_reply", "tick")

    def _wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        self._wrapped.append((owner, name, original))
        self.counts[label] = 0
        self.seconds[label] = 0.0

        def account(started: float) -> None:
            self.counts[label] += 1
            self.seconds[label] += time.thread_time() - started

        if inspect.iscoroutinefunction(original):

            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                started = time.thread_time()
                try:
                    return await original(*args, **kwargs)
                finally:
                    account(started)

        else:

            def wrapper(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                started = time.thread_time()
                try:
                    return original(*args, **kwargs)
                finally:
                    account(started)

        setattr(owner, name, wrapper)

    def reset(self) -> None:
        """Start counting afresh."""
        for label in self.counts:
            self.counts[label] = 0
            self.seconds[label] = 0.0

    def close(self) -> None:
        """Put the wrapped methods back."""
        for owner, name, original in reversed(self._wrapped):
            setattr(owner, name, original)


async def _one_run(socket_path: Path, tints: bool, pieces: int) -> dict[str, float]:
    from app.chats.history import History
    from app.client import EngineClient
    from app.settings import Settings
    from app.tui.app import DraftpenApp

    history = History(Path(tempfile.mkdtemp(prefix="dp-replay-")) / "history.sqlite3")
    app = DraftpenApp(
        connect=lambda settings, status: EngineClient(socket_path),
        history=history,
        settings=Settings(default_pair=PAIR, temperature=0.0, drafter="ngram"),
        pair_name=PAIR,
    )
    counting = Counting()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(400):
                await pilot.pause(0.05)
                if app.ready:
                    break
            if tints:
                toggled = app.action_toggle_provenance()
                if inspect.isawaitable(toggled):
                    await toggled
            prompt = app.chat_screen.query_one("#prompt")
            prompt.focus()
            prompt.insert(PROMPT)
            await pilot.pause(0.2)
            counting.reset()
            wall, thread_cpu, process_cpu = (
                time.monotonic(),
                time.thread_time(),
                time.process_time(),
            )
            await pilot.press("enter")
            while True:
                await app.workers.wait_for_complete()
                await pilot.pause()
                if app.chat_screen.reply is None and app.chat_screen.chat_id is not None:
                    break
            seconds = time.monotonic() - wall
            thread_cpu = time.thread_time() - thread_cpu
            process_cpu = time.process_time() - process_cpu
            stored = app.history.messages(app.chat_screen.chat_id)[-1]
            assert stored.content == "".join(tokens_of(REPLY)[:pieces]), "the reply differs"
    finally:
        counting.close()
    figures = {
        "seconds": seconds,
        "ui_thread_ms_per_s": 1000 * thread_cpu / seconds,
        "process_ms_per_s": 1000 * process_cpu / seconds,
    }
    for label, count in counting.counts.items():
        figures[f"{label}s"] = count
        figures[f"{label}_ms"] = 1000 * counting.seconds[label]
    return figures


def main() -> int:
    """Start the stand-in engine, run the app over it, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=30.0, help="tokens per second")
    parser.add_argument("--tokens", type=int, default=10_000, help="at most this many")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tree", type=Path, help="import app/backends from this checkout")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.rate, args.tokens))
        return 0
    tree = (args.tree or Path(__file__).resolve().parent.parent).resolve()
    sys.path.insert(0, str(tree))
    os.environ["DRAFTPEN_HOME"] = tempfile.mkdtemp(prefix="draftpen-ui-replay-")
    socket_path = Path(tempfile.mkdtemp(prefix="dp-rp-")) / "engine.sock"
    pieces = min(args.tokens, len(tokens_of(REPLY)))
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(socket_path), "--rate", str(args.rate),
         "--tokens", str(args.tokens)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        runs: dict[str, list[dict[str, float]]] = {"markdown": [], "tints": []}
        for _ in range(args.repeats):
            for mode in runs:
                run = asyncio.run(_one_run(socket_path, mode == "tints", pieces))
                runs[mode].append(run)
                print(f"  {mode:8s} {json.dumps({k: round(v, 1) for k, v in run.items()})}")
    finally:
        server.terminate()
        server.wait(10)
    print(
        f"\nUI CPU while a {pieces}-token reply streams at {args.rate:g} tok/s, "
        f"{args.repeats} repeats, tree {tree}, load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'mode':9s} {'UI thread ms/s':>14s} {'process ms/s':>12s}   layouts (ms)    "
        "paints (ms)     ticks (ms)     saves (ms)"
    )
    for mode, mine in runs.items():
        if not mine:
            continue

        def median(key: str, mine: list[dict[str, float]] = mine) -> float:
            return statistics.median(run[key] for run in mine)

        counted = "".join(
            f" {median(label + 's'):6.0f} ({median(label + '_ms'):5.0f})  "
            for label in ("layout", "paint", "tick", "save")
        )
        print(
            f"{mode:9s} {median('ui_thread_ms_per_s'):14.1f} "
            f"{median('process_ms_per_s'):12.1f} {counted}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
