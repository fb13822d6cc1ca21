"""A typed client of the engine's API over its Unix socket: the front ends' one way in.

Every call opens its own HTTP connection (httpx over the socket), so one client may be
used from several threads at once: the chat app streams a reply in a worker while its
models screen asks for the pair list. Transport failures become :class:`EngineLost`, or
:class:`EngineCrashedError` when the engine died by a fatal signal (its runtime crashed:
``crash_report`` reads the record it left); errors the engine answers become
:class:`EngineRequestError` with the engine's message. What a chat reply's request
and chunks say is chat_stream.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import httpx

from app.client.cancel_flag import CancelFlag
from app.client.chat_stream import ChatStream, ChatTurn, chat_request_body
from app.client.crash_report import crash_error
from app.client.errors import (
    RUNTIME_RESTARTED,
    RUNTIME_STOPPED,
    EngineLost,
    EngineRequestError,
    EngineRuntimeRestartedError,
)
from app.client.wire import HealthReport, LoadedPairReport, LoadRequest, PairCard, PairFiles

# No line for this long on a stream the engine keeps alive (it sends a comment every
# second while a request waits) means the engine is stuck or gone.
STREAM_SILENCE_SECONDS = 120.0
_CONNECT_SECONDS = 5.0


class EngineClient:
    """The engine on one socket. Cheap to create; holds no connection between calls."""

    def __init__(self, socket_path: Path, engine_pid: int | None = None) -> None:
        self.socket_path = socket_path
        # The engine process this client found (``find_engine`` knows it): a crash
        # record left by another engine on the same socket is then not taken for its.
        self.engine_pid = engine_pid

    def _http(self, read_timeout: float | None = 30.0) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=os.fspath(self.socket_path))
        timeout = httpx.Timeout(read_timeout, connect=_CONNECT_SECONDS)
        return httpx.Client(transport=transport, base_url="http://draftpen", timeout=timeout)

    def _get(self, path: str) -> Any:
        try:
            with self._http() as http:
                response = http.get(path)
        except httpx.TransportError as error:
            raise self._lost(error) from error
        return _json_or_raise(response)

    def health(self) -> HealthReport:
        """``GET /health``: version, loaded pairs, the queue."""
        return HealthReport.model_validate(self._get("/health"))

    def pairs(self) -> list[PairCard]:
        """``GET /v1/models``: the downloaded pairs, each with its ``loaded`` flag."""
        body = self._get("/v1/models")
        return [PairCard.model_validate(card) for card in body.get("data", [])]

    def load(
        self,
        pair_name: str,
        on_progress: Callable[[str], None] | None = None,
        context_length: int | None = None,
        exact: bool | None = None,
        workers: list[str] | None = None,
        files: tuple[Path, Path | None] | None = None,
    ) -> LoadedPairReport:
        """Make the engine load ``pair_name`` (or reload it with other settings).

        Progress lines go to ``on_progress`` as the engine reports them; returns what is
        loaded once it is. Raises :class:`EngineRequestError` when the pair cannot be
        loaded (not downloaded, a broken file, a worker gone), with the engine's message.
        ``workers``: HOST:PORT of each worker to split the target over ([]: none).
        ``files``: the target's and draft's paths of a pair this process made from
        ``--target``/``--draft`` (``command_line_pair_files``), which the engine
        registers under ``pair_name`` before it loads it.
        """
        shared = None
        if files is not None:
            target, draft = files
            draft_text = str(draft.absolute()) if draft is not None else None
            shared = PairFiles(target=str(target.absolute()), draft=draft_text)
        body = LoadRequest(
            pair=pair_name,
            files=shared,
            context_length=context_length,
            exact=exact,
            workers=workers,
        )
        report = on_progress or (lambda text: None)
        for payload in self._stream("/draftpen/load", body.model_dump(exclude_none=True)):
            extra = payload.get("draftpen") or {}
            if "loading" in extra:
                report(str(extra["loading"]))
            if "loaded" in extra:
                return LoadedPairReport.model_validate(extra["loaded"])
        raise self._crashed() or EngineLost(
            f"The engine on {self.socket_path} ended the load without an answer."
        )

    def chat(self, turn: ChatTurn, cancel: CancelFlag | None = None) -> ChatStream:
        """Stream one reply: :class:`Waiting`, :class:`Loading`, then generation events.

        The events carry the loop's text with provenance and the running statistics;
        the last has a ``finish_reason``. Setting ``cancel`` hangs the stream up at
        once (even while the engine sends nothing), and the engine stops the
        generation inside its round. Raises :class:`EngineLost` if the engine goes
        away. The stream's ``reasoning`` says how a thinking model marks its reasoning.
        """
        payloads = self._stream("/v1/chat/completions", chat_request_body(turn), cancel)
        return ChatStream(payloads)

    @contextlib.contextmanager
    def attach(self, on_lost: Callable[[EngineLost], None] | None = None) -> Iterator[None]:
        """Hold a connection that tells the engine a front end is using it.

        An engine started with ``--idle-exit`` stops only when idle and no client is
        attached. Raises :class:`EngineLost` if the engine cannot be reached. With
        ``on_lost``, a thread watches the connection and, if the engine goes away while
        it is held, calls ``on_lost`` with why (:class:`EngineCrashedError` when it
        crashed): how a front end that talks to the engine only through another program
        (``draftpen launch``) learns of it.
        """
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.settimeout(_CONNECT_SECONDS)
            connection.connect(os.fspath(self.socket_path))
            connection.sendall(b"GET /draftpen/attach HTTP/1.1\r\nHost: draftpen\r\n\r\n")
            status = connection.recv(64).split(b"\r\n", 1)[0]
        except OSError as error:
            connection.close()
            raise self._lost(error) from error
        if b" 200 " not in status + b" ":
            connection.close()
            answer = status.decode(errors="replace")
            raise EngineRequestError(
                f"The engine on {self.socket_path} refused to attach ({answer})."
            )
        released = threading.Event()
        watcher = None
        if on_lost is not None:
            watcher = threading.Thread(
                target=self._watch_attachment,
                args=(connection, released, on_lost),
                name="draftpen-attach-watch",
                daemon=True,
            )
            watcher.start()
        try:
            yield
        finally:
            released.set()
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)  # wakes the watcher's read
            connection.close()
            if watcher is not None:
                watcher.join(timeout=_CONNECT_SECONDS)

    def _watch_attachment(
        self,
        connection: socket.socket,
        released: threading.Event,
        on_lost: Callable[[EngineLost], None],
    ) -> None:
        """Read the attach stream until it ends; if it ends before it was released, the
        engine went away: tell ``on_lost`` why."""
        connection.settimeout(None)
        try:
            while connection.recv(4096):
                pass
            error: Exception = ConnectionResetError("the engine closed the attach stream")
        except OSError as closed:
            error = closed
        if not released.is_set():
            on_lost(self._lost(error))

    # -- streams ---------------------------------------------------------------

    def _stream(
        self, path: str, body: dict[str, Any], cancel: CancelFlag | None = None
    ) -> Generator[dict[str, Any], None, None]:
        """The JSON payloads of a server-sent event stream, until ``[DONE]``."""
        forget_hang_up: Callable[[], None] = lambda: None  # noqa: E731
        try:
            with (
                self._http(read_timeout=STREAM_SILENCE_SECONDS) as http,
                http.stream("POST", path, json=body) as response,
            ):
                if response.status_code != 200:
                    response.read()
                    _json_or_raise(response)
                if cancel is not None:
                    forget_hang_up = cancel.on_set(_hang_up(response))
                for line in response.iter_lines():
                    if cancel is not None and cancel.is_set():
                        return  # leaving the block closes the stream: the engine cancels
                    if not line.startswith("data: "):
                        continue  # blank lines and keep-alive comments
                    data = line.removeprefix("data: ")
                    if data == "[DONE]":
                        return
                    payload = json.loads(data)
                    if "error" in payload:
                        raise _stream_error(payload["error"] or {})
                    yield payload
        except httpx.TransportError as error:
            if cancel is not None and cancel.is_set():
                return  # our own hang-up ended the read
            raise self._lost(error) from error
        finally:
            forget_hang_up()  # the stream is over: a later set has nothing to close
        if cancel is None or not cancel.is_set():
            raise self._crashed() or EngineLost(
                f"The engine on {self.socket_path} closed the stream before it finished."
            )

    def _crashed(self) -> EngineLost | None:
        """The crash that took the engine away, if it died by a fatal signal."""
        return crash_error(self.socket_path, pid=self.engine_pid)

    def _lost(self, error: Exception) -> EngineLost:
        """What to raise for a transport failure: the crash, or the engine lost."""
        return self._crashed() or _lost(self.socket_path, error)


def _hang_up(response: httpx.Response) -> Callable[[], None]:
    """A function that shuts the stream's socket down, for :meth:`CancelFlag.on_set`.

    Shutting it down (from the thread that sets the flag) wakes the reading thread and
    tells the engine at once, which cancels the generation inside its round.
    """
    stream = response.extensions.get("network_stream")
    connection = stream.get_extra_info("socket") if stream is not None else None

    def hang_up() -> None:
        if isinstance(connection, socket.socket):
            with contextlib.suppress(OSError):  # already closed: nothing to do
                connection.shutdown(socket.SHUT_RDWR)
        # No socket to reach: the reader closes the stream at its next chunk.

    return hang_up


def _stream_error(error: dict[str, Any]) -> EngineRequestError:
    """The error a stream's error event reports; one for a runtime that died mid-reply."""
    message = str(error.get("message", "The engine failed the request."))
    code = error.get("code")
    if code in (RUNTIME_RESTARTED, RUNTIME_STOPPED):
        return EngineRuntimeRestartedError(message, code=code)
    return EngineRequestError(message, code=code)


def _json_or_raise(response: httpx.Response) -> Any:
    """The body of a 200 answer; an error answer raises with the engine's message."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code == 200 and body is not None:
        return body
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("code") in (RUNTIME_RESTARTED, RUNTIME_STOPPED):
        raise EngineRuntimeRestartedError(
            str(error.get("message")), status=response.status_code, code=error.get("code")
        )
    if isinstance(error, dict) and error.get("message"):
        raise EngineRequestError(
            str(error["message"]), status=response.status_code, code=error.get("code")
        )
    raise EngineRequestError(
        f"The engine answered {response.status_code} without an explanation.",
        status=response.status_code,
    )


def _lost(path: Path, error: Exception) -> EngineLost:
    return EngineLost(
        f"Lost the draftpen engine on {path} ({error or type(error).__name__}). "
        "It may have stopped or crashed; starting draftpen again starts a new one "
        "(its log: the draftpen cache directory, engine.log)."
    )
