"""A chat reply as the engine's client asks for it and reads it back.

:class:`ChatTurn` is the reply to ask for, and :func:`chat_request_body` the
chat-completions request it becomes; :class:`ChatStream` reads the streamed chunks back
as :data:`ChatItem`: :class:`Waiting` and :class:`Loading` notices, then
:class:`~backends.generation_events.GenerationEvent` (:func:`chat_item`). How the
request travels (the socket, errors, the engine lost) is engine_client.py's.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from app.client.wire import (
    DraftpenRequestOptions,
    QueueNotice,
    decode_reasoning,
    decode_segments,
    stats_from_wire,
)
from backends.base import ChatMessage
from backends.generation_events import GenerationEvent, TextSegment
from backends.output.reasoning import ReasoningFormat
from backends.sampling.filters import SamplingParams


@dataclass(frozen=True)
class ChatTurn:
    """One reply to ask for: the conversation so far and how to write the reply."""

    pair: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    drafter: str | None = None
    draft_tokens: int | None = None
    # Leave out the oldest turns that do not fit the context, as the chat app always did.
    fit_context: bool = True
    exact: bool | None = None
    stop: tuple[str, ...] = ()
    # A thinking model thinks (True), answers at once (False), or as its template likes.
    thinking: bool | None = None
    # OpenAI's fields, as they go on the wire: functions the model must or may call
    # ({"type": "function", "function": {...}}), and the JSON the reply must be.
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None


@dataclass(frozen=True)
class Waiting:
    """The request waits in the engine's queue behind ``position`` others (1: it runs next)."""

    position: int
    ahead: tuple[str, ...]  # what runs and waits before it: "agent request (starter)"


@dataclass(frozen=True)
class Loading:
    """The engine is loading the pair the request needs."""

    text: str


ChatItem = Waiting | Loading | GenerationEvent


class ChatStream:
    """A reply as it streams: iterate it for its items (:data:`ChatItem`).

    ``reasoning`` is how the reply marks a thinking model's reasoning (the engine knows
    it from the chat template), set once the first event is in; None for a model that
    does not think aloud. ``left_out_messages`` is how many of the oldest messages the
    engine left out of the prompt to fit its context (``ChatTurn.fit_context``), also
    known once the first event is in. The HTTP stream closes after the last event, or
    on :meth:`close`.
    """

    def __init__(self, payloads: Generator[dict[str, Any], None, None]) -> None:
        self._payloads = payloads
        self._finished = False
        self.reasoning: ReasoningFormat | None = None
        self.left_out_messages = 0

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> ChatItem:
        while not self._finished:
            payload = next(self._payloads)  # StopIteration: the stream ended
            extra = payload.get("draftpen") or {}
            if "reasoning" in extra:
                self.reasoning = decode_reasoning(extra["reasoning"])
            if "left_out_messages" in extra:
                self.left_out_messages = int(extra["left_out_messages"])
            item = chat_item(payload)
            if item is None:
                continue
            if isinstance(item, GenerationEvent) and item.finish_reason is not None:
                self.close()
            return item
        raise StopIteration

    def close(self) -> None:
        """Stop reading: the connection closes, and an unfinished reply is cancelled."""
        self._finished = True
        self._payloads.close()


def chat_request_body(turn: ChatTurn) -> dict[str, Any]:
    """The chat-completions request a :class:`ChatTurn` becomes."""
    params = turn.params
    body: dict[str, Any] = {
        "model": turn.pair,
        "messages": [{"role": m.role, "content": m.content} for m in turn.messages],
        "stream": True,
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "draftpen": DraftpenRequestOptions(
            provenance=True, progress=True, fit_context=turn.fit_context, client="chat"
        ).model_dump(),
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if turn.max_tokens is not None:
        body["max_tokens"] = turn.max_tokens
    if turn.stop:
        body["stop"] = list(turn.stop)
    speculative: dict[str, Any] = {}
    if turn.drafter is not None:
        speculative["drafter"] = turn.drafter
    if turn.draft_tokens is not None:
        speculative["k"] = turn.draft_tokens
    if turn.exact is not None:
        speculative["exact"] = turn.exact
    if speculative:
        body["speculative"] = speculative
    if turn.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": turn.thinking}
    if turn.tools:
        body["tools"] = list(turn.tools)
    if turn.tool_choice is not None:
        body["tool_choice"] = turn.tool_choice
    if turn.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = turn.parallel_tool_calls
    if turn.response_format is not None:
        body["response_format"] = turn.response_format
    return body


def chat_item(payload: dict[str, Any], *, provenance: bool = True) -> ChatItem | None:
    """What one stream chunk says: a notice, an event with text or the finish, or nothing.

    With ``provenance`` (what :meth:`EngineClient.chat` asks for) an event's text is its
    ``draftpen.segments``, the loop's own text (a thinking model's tags included), which
    the engine sends on exactly one chunk per event; the chunk's ``delta`` is OpenAI's
    rendering of it (reasoning apart, tool calls parsed) and is not read. Without it the
    text is the delta's content.
    """
    extra = payload.get("draftpen") or {}
    if "queue" in extra:
        notice = QueueNotice.model_validate(extra["queue"])
        return Waiting(notice.position, tuple(notice.ahead))
    if "loading" in extra:
        return Loading(str(extra["loading"]))
    choices = payload.get("choices") or []
    choice = choices[0] if choices else {}
    finish_reason = choice.get("finish_reason")
    if provenance:
        segments = decode_segments(extra.get("segments", []))
        text = "".join(segment.text for segment in segments)
    else:
        text = (choice.get("delta") or {}).get("content") or ""
        segments = (TextSegment(text, False),) if text else ()
    if not text and finish_reason is None:
        return None  # the opening chunk, a rendering of text already read, or usage
    return GenerationEvent(
        text=text,
        segments=segments,
        tokens=(),
        from_draft=(),
        drafter=str(extra.get("drafter", "none")),
        draft_length=int(extra.get("draft_length", 0)),
        stats=stats_from_wire(extra),
        finish_reason=finish_reason,
        estimated_speedup=float(extra.get("estimated_speedup", 1.0)),
        decision=str(extra.get("decision", "")),
        costs_note=str(extra.get("costs_note", "")),
    )
