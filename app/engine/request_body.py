"""Reading a request's body: its JSON, its size checked as it arrives.

A body over the server's limit (``MAX_BODY_BYTES`` unless the server is told otherwise)
gets a 413 that says so; it is read and thrown away up to a larger size first, so the
client gets its answer instead of a broken pipe. A body that is not JSON gets a 400.
"""

from __future__ import annotations

import json

from starlette.requests import ClientDisconnect, Request

from app.engine.schema import ApiError

MAX_BODY_BYTES = 1 << 20
# An oversize body is read and thrown away up to this size, so the client gets its 413
# instead of a broken pipe; beyond it the connection is simply closed.
_DRAIN_LIMIT_BYTES = 32 << 20


async def read_json_body(request: Request, max_body_bytes: int) -> object:
    """The parsed JSON body of ``request``; its size is checked as it arrives."""
    body = bytearray()
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > _DRAIN_LIMIT_BYTES:
                break
            if received <= max_body_bytes:
                body += chunk
    except ClientDisconnect:
        # Nobody will read the answer; this just ends the request without a traceback.
        raise ApiError(400, "The client disconnected while sending the request.") from None
    if received > max_body_bytes:
        raise ApiError(
            413,
            f"The request body is larger than {_size_text(max_body_bytes)}, the "
            "most this server accepts. Send a shorter prompt.",
            code="request_too_large",
        )
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as error:
        raise ApiError(
            400, f"The request body is not valid JSON: {error}.", code="invalid_json"
        ) from None


def _size_text(size: int) -> str:
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    return f"{size} bytes"
