"""Anthropic's Messages API: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

A thin adapter: the request is translated into the engine's one chat request
(:mod:`.anthropic_schema`) and answered by :meth:`AgentApi.respond_chat`, the same path
as OpenAI's chat completions (prompt, tools' grammar, limits, queue, loop, caches);
only the answer's shape is Anthropic's, written by :class:`MessagesFormat` from the
same tally, tool-call parser and reasoning split as :class:`ChatFormat`.

A message's ``content`` is a ``thinking`` block (a model that reasons aloud), a
``text`` block and one ``tool_use`` block per call, in that order, as the model wrote
them. ``stop_reason`` is ``tool_use`` when the reply called tools, ``stop_sequence``
(with the string in ``stop_sequence``) when one of the request's ``stop_sequences``
ended it, ``max_tokens`` at the limit (or the context's end), ``end_turn`` otherwise.
``usage.input_tokens`` counts the prompt tokens read for this request and
``cache_read_input_tokens`` those the engine already held, so their sum is the prompt.

Streams follow Anthropic's events: ``message_start``, ``ping``, then for each block
``content_block_start``, its deltas (``thinking_delta``, ``text_delta``,
``input_json_delta``) and ``content_block_stop``, then ``message_delta`` (stop reason
and usage) and ``message_stop``; an error after the status line is an ``error`` event.
Every message and ``message_delta`` also carries draftpen's statistics in ``draftpen``.
Errors have Anthropic's shape and statuses; a full queue is ``529 overloaded_error``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.engine.chunks import sse_event
from app.engine.dialects.anthropic_schema import (
    CountTokensRequest,
    MessagesRequest,
    parse_messages_request,
)
from app.engine.dialects.anthropic_translation import chat_request
from app.engine.dialects.openai_chat_format import ChatFormat
from app.engine.dialects.responder import ChatResponder
from app.engine.schema import ApiError
from app.engine.tally import GenerationTally
from backends.generation_events import FINISH_LENGTH, GenerationEvent
from backends.output.tool_call_pieces import (
    ArgumentsPiece,
    ContentPiece,
    ParsedPiece,
    ToolCallStart,
)

# Anthropic's error type for each status draftpen answers with.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
# Anthropic's status for an overloaded server, which its SDKs retry.
OVERLOADED = 529


def anthropic_error_body(error: ApiError) -> dict[str, Any]:
    """``error`` in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``."""
    status = OVERLOADED if error.status == 503 else error.status
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def new_message_id() -> str:
    """A fresh message id in Anthropic's shape, ``msg_…``."""
    return f"msg_{uuid.uuid4().hex[:24]}"


class MessagesFormat(ChatFormat):
    """A chat reply as an Anthropic message, whole or as a stream of its events."""

    id_prefix = "msg"

    def __init__(self, model_id: str, **options: Any) -> None:
        super().__init__(model_id, **options)
        self._started = False
        # The content block being streamed: its index and type (None: none is open).
        self._block_index = -1
        self._block_type: str | None = None

    # -- whole -------------------------------------------------------------------

    def response(self, tally: GenerationTally) -> dict[str, Any]:
        """The whole message: thinking, text and tool_use blocks, stop reason, usage."""
        reply = self.parsed_reply(tally)
        content: list[dict[str, Any]] = []
        if tally.reasoning_text:
            # A local model's reasoning has no signature to verify; "" is the field's type.
            content.append({"type": "thinking", "thinking": tally.reasoning_text, "signature": ""})
        if reply.content:
            content.append({"type": "text", "text": reply.content})
        for call in reply.tool_calls or ():
            content.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": _input(call.arguments),
                }
            )
        return {
            **self._message(content),
            **self._stop(tally),
            "usage": self.usage(tally),
            "draftpen": tally.draftpen(),
        }

    def usage(self, tally: GenerationTally) -> dict[str, Any]:
        """Anthropic's usage: the prompt tokens read now and those found cached, the reply's."""
        stats = tally.last.stats if tally.last else None
        cached = stats.cached_prompt_tokens if stats else 0
        return {
            "input_tokens": (stats.prompt_tokens if stats else 0) - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": stats.generated_tokens if stats else 0,
        }

    # -- streamed ----------------------------------------------------------------

    def sse_open(self) -> list[str]:
        """Nothing yet: ``message_start`` goes with the first event, which knows the usage."""
        return []

    def sse_events(self, event: GenerationEvent, tally: GenerationTally) -> list[str]:
        """The block starts, deltas and stops for one event's reasoning, text and calls."""
        events = self._start(tally)
        split = tally.latest
        if split.reasoning_text:
            events += self._into_block("thinking", {"thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": split.reasoning_text}))
        pieces: list[ParsedPiece]
        parser = self.tool_parser
        if parser is not None:
            # The parser sees the answer only: a call written while reasoning is not made.
            pieces = parser.feed(split.answer_text)
            if event.finish_reason is not None:
                pieces += parser.finish()
        else:
            pieces = [ContentPiece(split.answer_text)] if split.answer_text else []
        for piece in pieces:
            events += self._piece_events(piece)
        if event.finish_reason is not None:
            events += self._close_block()
        return events

    def sse_close(self, tally: GenerationTally) -> list[str]:
        """``message_delta`` with the stop reason and the usage, then ``message_stop``."""
        events = self._start(tally) + self._close_block()
        delta = {
            "type": "message_delta",
            "delta": self._stop(tally),
            "usage": self.usage(tally),
            "draftpen": tally.draftpen(),
        }
        events.append(sse_event(delta, "message_delta"))
        events.append(sse_event({"type": "message_stop"}, "message_stop"))
        return events

    def sse_error(self, error: ApiError) -> list[str]:
        """An ``error`` event, as Anthropic's API sends one mid-stream."""
        return [sse_event(anthropic_error_body(error), "error")]

    def _start(self, tally: GenerationTally) -> list[str]:
        """``message_start`` (and a ``ping``), once, before anything else."""
        if self._started:
            return []
        self._started = True
        message = {**self._message([]), "stop_reason": None, "stop_sequence": None}
        message["usage"] = {**self.usage(tally), "output_tokens": 0}
        return [
            sse_event({"type": "message_start", "message": message}, "message_start"),
            sse_event({"type": "ping"}, "ping"),
        ]

    def _piece_events(self, piece: ParsedPiece) -> list[str]:
        if isinstance(piece, ContentPiece):
            if not piece.text:
                return []
            events = self._into_block("text", {"text": ""})
            return [*events, self._delta({"type": "text_delta", "text": piece.text})]
        if isinstance(piece, ToolCallStart):
            # Every call is a block of its own, even right after another call.
            events = self._close_block()
            block = {"id": piece.id, "name": piece.name, "input": {}}
            return events + self._open_block("tool_use", block)
        assert isinstance(piece, ArgumentsPiece)
        return [self._delta({"type": "input_json_delta", "partial_json": piece.text})]

    def _into_block(self, kind: str, fields: dict[str, Any]) -> list[str]:
        """Open a block of ``kind`` unless one is open already."""
        if self._block_type == kind:
            return []
        return self._close_block() + self._open_block(kind, fields)

    def _open_block(self, kind: str, fields: dict[str, Any]) -> list[str]:
        self._block_index += 1
        self._block_type = kind
        start = {
            "type": "content_block_start",
            "index": self._block_index,
            "content_block": {"type": kind, **fields},
        }
        return [sse_event(start, "content_block_start")]

    def _close_block(self) -> list[str]:
        if self._block_type is None:
            return []
        self._block_type = None
        stop = {"type": "content_block_stop", "index": self._block_index}
        return [sse_event(stop, "content_block_stop")]

    def _delta(self, delta: dict[str, Any]) -> str:
        body = {"type": "content_block_delta", "index": self._block_index, "delta": delta}
        return sse_event(body, "content_block_delta")

    # -- both --------------------------------------------------------------------

    def _message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model_id,
            "content": content,
        }

    def _stop(self, tally: GenerationTally) -> dict[str, Any]:
        """``stop_reason`` and ``stop_sequence``, from how the generation ended."""
        last = tally.last
        stop_sequence = last.stop_sequence if last is not None else None
        if tally.finish_reason == FINISH_LENGTH:
            reason = "max_tokens"
        elif self.tool_parser is not None and self.tool_parser.made_calls:
            reason = "tool_use"
        elif stop_sequence is not None:
            reason = "stop_sequence"
        else:
            # An end-of-turn token; also a generation cancelled (the client left, or the
            # server stopped), which Anthropic's reasons have no word for.
            reason = "end_turn"
        return {
            "stop_reason": reason,
            "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
        }


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's ``input`` is."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        # Only an unconstrained reply cut off mid-call gets here (the grammar keeps a
        # finished call's arguments JSON): what was written, kept where a client sees it.
        return {"_unparsed_arguments": arguments}
    return value if isinstance(value, dict) else {"_arguments": value}


class MessagesRoutes:
    """The Messages routes over one engine's API."""

    def __init__(self, api: ChatResponder) -> None:
        self.api = api

    async def create(self, request: Request) -> Response:
        """``POST /v1/messages``."""
        body = await self.api.read_json(request)
        parsed = parse_messages_request(MessagesRequest, body)
        chat = chat_request(parsed)
        try:
            return await self.api.respond_chat(
                request, chat, MessagesFormat, response_id=new_message_id()
            )
        except ApiError as error:
            raise _overloaded(error) from None

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the prompt's tokens, by the model's template."""
        body = await self.api.read_json(request)
        parsed = parse_messages_request(CountTokensRequest, body)
        try:
            count = await self.api.count_chat_tokens(chat_request(parsed))
        except ApiError as error:
            raise _overloaded(error) from None
        return JSONResponse({"input_tokens": count})


def _overloaded(error: ApiError) -> ApiError:
    """A busy or stopping server (503) answers 529, the status Anthropic's clients retry."""
    if error.status != 503:
        return error
    return ApiError(
        OVERLOADED,
        error.message,
        error_type=error.error_type,
        param=error.param,
        code=error.code,
        headers=error.headers,
    )


def anthropic_routes(api: ChatResponder) -> list[Route]:
    """``/v1/messages`` and ``/v1/messages/count_tokens``, answered by ``api``."""
    routes = MessagesRoutes(api)
    return [
        Route("/v1/messages", routes.create, methods=["POST"]),
        Route("/v1/messages/count_tokens", routes.count_tokens, methods=["POST"]),
    ]
