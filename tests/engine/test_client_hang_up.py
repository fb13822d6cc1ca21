"""Stopping a reply hangs up its stream at once, even while the engine sends nothing.

The engine learns that a reply was stopped only from its closed connection. A client
that closed the stream only when the next chunk arrived would leave the engine writing
through a long round (or a queue wait) after Esc. The server here is a bare Unix
socket that answers the request's headers and then stays silent, as an engine inside a
long round is, and watches for the client's hang-up.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from app.client import CancelFlag, ChatTurn, EngineClient
from backends.base import ChatMessage

_HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


class SilentEngine:
    """Accepts one request, answers its headers, then waits for the client to hang up."""

    def __init__(self, path: Path) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.answered = threading.Event()
        self.hung_up = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            connection.sendall(_HEADERS)
            self.answered.set()
            connection.settimeout(60)
            try:
                while connection.recv(65536):
                    pass  # the rest of the request body, if any
                self.hung_up.set()  # recv returned b"": the client closed its end
            except OSError:
                self.hung_up.set()  # a reset is a hang-up too

    def close(self) -> None:
        self.listener.close()


def test_setting_cancel_closes_a_silent_stream_at_once(tmp_path: Path) -> None:
    path = tmp_path / "engine.sock"
    engine = SilentEngine(path)
    cancel = CancelFlag()
    turn = ChatTurn(pair="any", messages=(ChatMessage("user", "hello"),))
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(list(EngineClient(path).chat(turn, cancel)))
        except Exception as error:  # recorded, so the test can say what went wrong
            outcome.append(error)

    threads_before = threading.active_count()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert engine.answered.wait(10)
        # Nothing polls the flag meanwhile: the reader is the stream's only thread.
        assert threading.active_count() == threads_before + 1
        assert not engine.hung_up.wait(0.3)  # a silent stream is kept open meanwhile
        cancel.set()
        # The engine would send nothing for two minutes: only the hang-up ends this.
        assert engine.hung_up.wait(10)
        reader.join(10)
        assert not reader.is_alive()
        assert outcome == [[]]  # a stopped stream ends quietly, with nothing read
    finally:
        engine.close()


def test_a_hook_runs_once_when_set_and_not_once_forgotten() -> None:
    flag = CancelFlag()
    calls: list[str] = []
    flag.on_set(lambda: calls.append("kept"))
    forget = flag.on_set(lambda: calls.append("forgotten"))
    forget()
    flag.set()
    flag.set()
    assert calls == ["kept"]
    assert flag.is_set()


def test_a_hook_registered_after_the_flag_is_set_runs_at_once() -> None:
    flag = CancelFlag()
    flag.set()
    calls: list[str] = []
    flag.on_set(lambda: calls.append("late"))
    assert calls == ["late"]
