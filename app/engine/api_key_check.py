"""TCP lets no one in without the engine's key: an ASGI middleware around every route.

A request that came over TCP must carry the key (``app.client.api_key``) as
``Authorization: Bearer KEY`` (OpenAI's SDKs, Codex, opencode, Claude Code's auth
token) or ``x-api-key: KEY`` (Anthropic's SDK); the comparison takes the same time
whatever the key sent. Without it, or with another key, the answer is 401 in the
error shape of the dialect the path speaks (``http_errors.error_body``), before the
route runs or the body is read. Every path is covered, ``/health`` too: on TCP
nobody learns even which pairs this engine holds without the key (the Unix socket's
clients, which probe ``/health``, need none).

Connections on the Unix socket pass: the socket's mode, its directory and the peer-uid
check (``unix_socket``) already let only this user in. uvicorn names a Unix-socket
connection's server by its path with no port (``scope["server"]`` is ``(path, None)``);
a TCP one always has a port, and a connection it cannot place needs the key.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.engine.http_errors import error_body
from app.engine.schema import ApiError

_BEARER = b"bearer "


def over_unix_socket(scope: Scope) -> bool:
    """Whether the connection of ``scope`` came over the Unix socket."""
    server = scope.get("server")
    return server is not None and server[1] is None


def sent_keys(scope: Scope) -> list[bytes]:
    """The keys a request carries: its bearer token and its ``x-api-key``."""
    keys = []
    for name, value in scope.get("headers", ()):
        if name == b"authorization" and value[: len(_BEARER)].lower() == _BEARER:
            keys.append(value[len(_BEARER) :].strip())
        elif name == b"x-api-key":
            keys.append(value.strip())
    return keys


class ApiKeyCheck:
    """Answers 401 to a TCP request without ``key``; passes everything else to ``app``."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self._key = key.encode()

    def _allowed(self, scope: Scope) -> bool:
        # Every key sent is compared in full, so the time taken says nothing of the key.
        matches = [hmac.compare_digest(sent, self._key) for sent in sent_keys(scope)]
        return any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or over_unix_socket(scope) or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if sent_keys(scope):
            message = (
                "The API key sent is not this draftpen engine's key. Send the key "
                "`draftpen serve` showed (kept in the file api-key in draftpen's config "
                "directory, unless --api-key or DRAFTPEN_API_KEY set another)."
            )
        else:
            message = (
                "This draftpen engine listens on TCP and needs its API key: send "
                "'Authorization: Bearer KEY' or 'x-api-key: KEY', with the key "
                "`draftpen serve` showed (kept in the file api-key in draftpen's config "
                "directory). `draftpen launch` passes it to agent CLIs itself."
            )
        error = ApiError(401, message, code="invalid_api_key")
        response = JSONResponse(
            error_body(scope["path"], error),
            status_code=401,
            headers={"WWW-Authenticate": 'Bearer realm="draftpen"'},
        )
        await response(scope, receive, send)
