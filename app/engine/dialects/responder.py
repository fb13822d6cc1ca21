"""What a dialect's routes need of the engine's API, named as a Protocol.

The API (:class:`~app.engine.api.AgentApi`) registers the dialects' routes, so a dialect
must not import it back: it names here the few methods it calls.
"""

from __future__ import annotations

from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response

from app.engine.dialects.openai_chat_format import ChatFormat
from app.engine.dialects.openai_chat_schema import ChatCompletionRequest


class ChatResponder(Protocol):
    """The engine API's methods a dialect's routes call."""

    async def read_json(self, request: Request) -> object:
        """The request's JSON body, its size checked."""
        ...

    async def respond_chat(
        self,
        request: Request,
        parsed: ChatCompletionRequest,
        make_format: type[ChatFormat],
        *,
        response_id: str | None = None,
    ) -> Response:
        """Answer a chat request in ``make_format``'s shape."""
        ...

    async def count_chat_tokens(self, parsed: ChatCompletionRequest) -> int:
        """The prompt's length in tokens, rendered by the model's own template."""
        ...
