"""The Responses API's answer: the response object, whole or as its stream of events.

A reply becomes output items in the order the model wrote them: a ``reasoning`` item
(a model that thinks aloud; its text in ``content[].reasoning_text``), a ``message``
with one ``output_text`` part, and one ``function_call`` item per call. They are read
out of the reply by the same tally, reasoning split and tool-call parser as chat
completions'; :class:`OutputItems` builds them, and the events that announce them,
from the parser's pieces, so a stream and a whole response cannot differ.

A stream is ``response.created``, ``response.in_progress``, then for each item
``response.output_item.added``, its parts and deltas
(``response.content_part.added``, ``response.output_text.delta`` /
``response.reasoning_text.delta`` / ``response.function_call_arguments.delta``, their
``.done``, ``response.content_part.done``) and ``response.output_item.done``, and last
``response.completed`` (``response.incomplete`` when the reply hit
``max_output_tokens`` or the context's end; ``response.failed`` on an error). Every
event carries ``sequence_number``, counting from 0. The finished response object
carries draftpen's statistics in ``draftpen``, and is stored when ``store`` is true.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any, ClassVar

from app.engine.chunks import sse_event
from app.engine.dialects.openai_chat_format import ChatFormat
from app.engine.dialects.responses_items import parse_items
from app.engine.dialects.responses_request import ResponsesTurn
from app.engine.dialects.responses_store import ResponsesStore, StoredResponse
from app.engine.schema import ApiError
from app.engine.tally import GenerationTally
from backends.generation_events import FINISH_LENGTH, FINISH_STOP, GenerationEvent
from backends.output.tool_call_pieces import (
    ArgumentsPiece,
    ContentPiece,
    ParsedPiece,
    ToolCallStart,
)


def new_item_id(prefix: str) -> str:
    """A fresh id in OpenAI's shape: ``resp_…``, ``msg_…``, ``fc_…``, ``rs_…``."""
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
    """A response's output items, built from the reply's pieces as they come.

    Each change is also recorded as the stream event that announces it (``events``,
    drained by the caller); a whole response just ignores them. An item stays open
    while the model writes it, and is finished when the next one begins or at
    :meth:`finish`.
    """

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # the parser's call index -> item
        self._index: dict[str, int] = {}  # an item's id -> its place in the output

    def reasoning(self, text: str) -> None:
        """More of the model's reasoning."""
        item = self._writing("reasoning")
        item["content"][0]["text"] += text
        self._emit("response.reasoning_text.delta", item, content_index=0, delta=text)

    def add(self, piece: ParsedPiece) -> None:
        """One piece of the answer, as the tool-call parser decided it."""
        if isinstance(piece, ContentPiece):
            if piece.text:
                item = self._writing("message")
                item["content"][0]["text"] += piece.text
                self._emit(
                    "response.output_text.delta",
                    item,
                    content_index=0,
                    delta=piece.text,
                    logprobs=[],
                )
        elif isinstance(piece, ToolCallStart):
            self._finish_open()
            call = {
                "id": new_item_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": piece.id,
                "name": piece.name,
                "arguments": "",
            }
            self._begin(call)
            self._calls[piece.index] = call
        elif isinstance(piece, ArgumentsPiece):
            call = self._calls[piece.index]
            call["arguments"] += piece.text
            self._emit("response.function_call_arguments.delta", call, delta=piece.text)

    def finish(self) -> list[dict[str, Any]]:
        """Finish the open item; the output (an empty message when the reply was empty)."""
        if not self.items:
            self._writing("message")
        self._finish_open()
        return self.items

    def _writing(self, kind: str) -> dict[str, Any]:
        """The open item of ``kind``, begun now if another kind (or none) is open."""
        if self._open is not None and self._open["type"] == kind:
            return self._open
        self._finish_open()
        if kind == "message":
            item = {
                "id": new_item_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
            part["logprobs"] = []
        else:
            item = {
                "id": new_item_id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [],
            }
            part = {"type": "reasoning_text", "text": ""}
        self._begin(item)
        item["content"].append(part)
        self._emit("response.content_part.added", item, content_index=0, part=copy.deepcopy(part))
        return item

    def _begin(self, item: dict[str, Any]) -> None:
        self._index[item["id"]] = len(self.items)
        self.items.append(item)
        self._open = item
        self.events.append(
            {
                "type": "response.output_item.added",
                "output_index": self._index[item["id"]],
                "item": copy.deepcopy(item),
            }
        )

    def _finish_open(self) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        if item["type"] == "function_call":
            self._emit(
                "response.function_call_arguments.done",
                item,
                name=item["name"],
                arguments=item["arguments"],
            )
        else:
            part = item["content"][0]
            if item["type"] == "message":
                self._emit(
                    "response.output_text.done",
                    item,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            else:
                self._emit("response.reasoning_text.done", item, content_index=0, text=part["text"])
            self._emit(
                "response.content_part.done", item, content_index=0, part=copy.deepcopy(part)
            )
        item["status"] = "completed"
        self.events.append(
            {
                "type": "response.output_item.done",
                "output_index": self._index[item["id"]],
                "item": copy.deepcopy(item),
            }
        )

    def _emit(self, kind: str, item: dict[str, Any], /, **fields: Any) -> None:
        self.events.append(
            {"type": kind, "item_id": item["id"], "output_index": self._index[item["id"]], **fields}
        )


class ResponsesFormat(ChatFormat):
    """A chat reply as a Responses API response object, or its stream of events.

    Made for one request by :func:`responses_format`, which binds the request's
    :class:`ResponsesTurn` and the store the answer is kept in.
    """

    id_prefix = "resp"
    turn: ClassVar[ResponsesTurn]
    store: ClassVar[ResponsesStore]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._output = OutputItems()
        self._sequence = 0
        self._opened = False

    # -- the whole response -------------------------------------------------------

    def response(self, tally: GenerationTally) -> dict[str, Any]:
        """The finished response object (stored when the request said ``store``)."""
        output = OutputItems()
        if tally.reasoning_text:
            output.reasoning(tally.reasoning_text)
        parser = self.tool_parser
        if parser is None:
            pieces: list[ParsedPiece] = [ContentPiece(tally.text)]
        else:
            pieces = [piece for text in tally.pieces for piece in parser.feed(text)]
            pieces += parser.finish()
        for piece in pieces:
            output.add(piece)
        return self._finished(tally, output.finish())

    # -- the stream ---------------------------------------------------------------

    def sse_open(self) -> list[str]:
        """``response.created`` and ``response.in_progress``, with no output yet."""
        self._opened = True
        snapshot = self._response_object("in_progress", [])
        return [
            self._event({"type": "response.created", "response": snapshot}),
            self._event({"type": "response.in_progress", "response": snapshot}),
        ]

    def sse_events(self, event: GenerationEvent, tally: GenerationTally) -> list[str]:
        """The item, part and delta events for one event of the loop."""
        split = tally.latest
        if split.reasoning_text:
            self._output.reasoning(split.reasoning_text)
        parser = self.tool_parser
        if parser is None:
            pieces: list[ParsedPiece] = [ContentPiece(split.answer_text)]
        else:
            # The parser sees the answer only: a call written while reasoning is not made.
            pieces = parser.feed(split.answer_text)
            if event.finish_reason is not None:
                pieces += parser.finish()
        for piece in pieces:
            self._output.add(piece)
        return self._drain()

    def sse_close(self, tally: GenerationTally) -> list[str]:
        """The open item's last events, then ``response.completed`` (or its kin)."""
        body = self._finished(tally, self._output.finish())
        name = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            body["status"], "response.failed"
        )
        return [*self._drain(), self._event({"type": name, "response": body})]

    def sse_error(self, error: ApiError) -> list[str]:
        """``response.failed``, carrying the error and whatever output came before it."""
        opening = [] if self._opened else self.sse_open()
        failure = {"code": error.code or "server_error", "message": error.message}
        body = self._response_object("failed", copy.deepcopy(self._output.items))
        body["error"] = failure
        return [*opening, self._event({"type": "response.failed", "response": body})]

    # -- the parts ----------------------------------------------------------------

    def _finished(self, tally: GenerationTally, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The response object of a reply that ended; kept in the store if asked."""
        finish = tally.finish_reason
        if finish == FINISH_STOP:
            body = self._response_object("completed", output, tally)
        elif finish == FINISH_LENGTH:
            body = self._response_object("incomplete", output, tally)
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        else:
            body = self._response_object("failed", output, tally)
            body["error"] = {
                "code": "server_error",
                "message": "The generation was cancelled before it finished (the server is "
                "stopping, or the request was cancelled).",
            }
        if self.turn.store and body["status"] != "failed":
            # The output items continue the conversation as input items.
            kept = (*self.turn.conversation, *parse_items(output, "output"))
            self.store.put(self.id, StoredResponse(body, kept))
        return body

    def _response_object(
        self, status: str, output: list[dict[str, Any]], tally: GenerationTally | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            **self.turn.echo,
            "model": self.model_id,
            "output": output,
            "usage": _usage(tally) if tally is not None else None,
        }
        if tally is not None:
            body["draftpen"] = tally.draftpen()
        return body

    def _drain(self) -> list[str]:
        events, self._output.events = self._output.events, []
        return [self._event(event) for event in events]

    def _event(self, data: dict[str, Any]) -> str:
        data["sequence_number"] = self._sequence
        self._sequence += 1
        return sse_event(data, data["type"])


def _usage(tally: GenerationTally) -> dict[str, Any]:
    """The Responses API's usage block, from chat's."""
    usage = tally.usage()
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": usage["completion_tokens_details"]["reasoning_tokens"]
        },
        "total_tokens": usage["total_tokens"],
    }


def responses_format(turn: ResponsesTurn, store: ResponsesStore) -> type[ResponsesFormat]:
    """A :class:`ResponsesFormat` for one request: ``respond_chat`` makes it with chat's
    arguments, and this binds what only the Responses API needs."""

    class RequestResponsesFormat(ResponsesFormat):
        pass

    RequestResponsesFormat.turn = turn
    RequestResponsesFormat.store = store
    return RequestResponsesFormat
