"""OpenAI's response shapes: the whole response, stream chunks and server-sent events.

Chat completions and text completions differ only in how a choice looks; both carry
the running speculative statistics in a ``draftpen`` field. A chat reply to a request
with tools runs through a :class:`~backends.tool_calls.ToolCallParser`, streaming or
not: its calls become ``tool_calls`` (``delta.tool_calls`` in a stream, as OpenAI sends
them: index, id, type and name first, then ``arguments`` fragments), and
``finish_reason`` is ``"tool_calls"``.

When a request asks for logprobs, each choice carries the target's log-probabilities
of its tokens in OpenAI's shape for the endpoint (chat: ``logprobs.content``, one entry
per token with its text, bytes and ``top_logprobs``; completions: parallel lists
``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``). A stream sends
each token's entry in the first chunk that goes out after the token was generated, so
the chunks' logprobs concatenate to the whole response's, tool calls or not.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from app.client.wire import encode_reasoning, encode_segments
from app.engine.schema import ApiError
from app.engine.tally import GenerationTally
from backends.reasoning import ReasoningFormat
from backends.speculative import GenerationEvent, TokenLogprob
from backends.tool_calls import (
    ArgumentsPiece,
    ContentPiece,
    ParsedPiece,
    ParsedReply,
    ToolCallParser,
    ToolCallStart,
)


class ResponseFormat:
    """OpenAI's response shapes for one request: the full response and stream chunks."""

    id_prefix = ""
    response_object = ""
    chunk_object = ""
    # Whether a stream sends a comment every second without news (reading a long
    # prompt, say), for clients whose HTTP stack drops a silent stream: set by dialects
    # whose agents read long prompts on slow machines. A client that asked for progress
    # gets them anyway.
    keep_alive = False

    def __init__(
        self,
        model_id: str,
        *,
        include_usage: bool,
        token_bytes: Callable[[int], bytes] | None = None,
        provenance: bool = False,
        response_id: str | None = None,
        left_out_messages: int = 0,
    ) -> None:
        self.id = response_id or new_response_id(self.id_prefix)
        # The oldest messages fit_context left out of the prompt (0: none, or not asked).
        self.left_out_messages = left_out_messages
        self.created = int(time.time())
        self.model_id = model_id
        self.include_usage = include_usage
        # A draftpen client asked for each event's text as [[text, from_draft], ...].
        self.provenance = provenance
        # Set when the request asked for logprobs: a token's bytes, for its text.
        self.token_bytes = token_bytes
        self._first_chunk = True
        # Logprobs of tokens generated but not yet sent in a chunk (their text may be
        # held back, or still being read as a tool call).
        self._pending_logprobs: list[TokenLogprob] = []

    def new_tally(self) -> GenerationTally:
        """A fresh tally for this response's events."""
        return GenerationTally(left_out_messages=self.left_out_messages)

    def _envelope(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model_id,
            "system_fingerprint": None,
        }

    def _chunk(self, choice: dict[str, Any], tally: GenerationTally) -> dict[str, Any]:
        if self.token_bytes is not None and self._pending_logprobs:
            choice["logprobs"] = self._logprobs(self._pending_logprobs)
            self._pending_logprobs = []
        chunk = {**self._envelope(self.chunk_object), "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI: only the last chunk carries usage
        chunk["draftpen"] = tally.draftpen()
        return chunk

    def notice_chunk(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A chunk with no choices whose ``draftpen`` object carries a queue or load notice."""
        return {**self._envelope(self.chunk_object), "choices": [], "draftpen": fields}

    def event_chunks(self, event: GenerationEvent, tally: GenerationTally) -> list[dict[str, Any]]:
        """:meth:`stream_chunks`, and for a client that asked for provenance, the event's
        own text as ``draftpen.segments``, on exactly one chunk.

        Segments are the loop's text as it came (reasoning tags included, nothing held
        back or parsed), so a draftpen client rebuilds the loop's events from them; a
        new chunk with no choices carries them when the event made no chunk of its own.
        """
        chunks = self.stream_chunks(event, tally)
        if self.provenance and event.text:
            if not chunks:
                chunks.append(self.notice_chunk(tally.draftpen()))
            chunks[0]["draftpen"]["segments"] = encode_segments(event.segments)
            chunks[0]["draftpen"]["reasoning"] = encode_reasoning(self.reasoning_marks)
        return chunks

    @property
    def reasoning_marks(self) -> ReasoningFormat | None:
        """How the reply marks reasoning (None here: only chat replies have any)."""
        return None

    def stream_chunks(self, event: GenerationEvent, tally: GenerationTally) -> list[dict[str, Any]]:
        """The chunks for one event: its text (if any), then the finish (if it is the last)."""
        self._pending_logprobs.extend(event.token_logprobs)
        chunks = []
        if event.text or self._first_chunk:
            chunks.append(self._chunk(self._text_choice(event.text, self._first_chunk), tally))
            self._first_chunk = False
        if event.finish_reason is not None:
            chunks.append(self._chunk(self._finish_choice(event.finish_reason), tally))
        return chunks

    def usage_chunk(self, tally: GenerationTally) -> dict[str, Any]:
        """The last chunk when ``stream_options.include_usage`` is set: no choices, usage."""
        return {
            **self._envelope(self.chunk_object),
            "choices": [],
            "usage": tally.usage(),
            "draftpen": tally.draftpen(),
        }

    def response(self, tally: GenerationTally) -> dict[str, Any]:
        """The whole response of a request that did not stream."""
        choice = self._whole_choice(tally.text, tally.finish_reason)
        choice["logprobs"] = self._whole_logprobs(tally)
        return {
            **self._envelope(self.response_object),
            "choices": [choice],
            "usage": tally.usage(),
            "draftpen": tally.draftpen(),
        }

    # -- server-sent events: how this dialect frames a stream -----------------------
    # OpenAI's chat and completions streams are bare ``data:`` lines ending in
    # ``[DONE]``; other dialects (Anthropic Messages, OpenAI Responses) override these
    # to name their events and open and close the stream their own way. The engine's
    # job stream (app.engine.job_responses) calls only these.

    def sse_open(self) -> list[str]:
        """Events sent before the first generation event (none for OpenAI's chunks)."""
        return []

    def sse_events(self, event: GenerationEvent, tally: GenerationTally) -> list[str]:
        """The events for one generation event."""
        return [sse_event(chunk) for chunk in self.event_chunks(event, tally)]

    def sse_close(self, tally: GenerationTally) -> list[str]:
        """Events after the last generation event: usage if asked, then ``[DONE]``."""
        closing = [sse_event(self.usage_chunk(tally))] if self.include_usage else []
        return [*closing, sse_event("[DONE]")]

    def sse_error(self, error: ApiError) -> list[str]:
        """An error found after the status line went out, as this dialect reports it."""
        return [sse_event(error.body())]

    def _whole_logprobs(self, tally: GenerationTally) -> dict[str, Any] | None:
        """The whole reply's logprobs block, or None when the request did not ask."""
        return self._logprobs(tally.logprobs) if self.token_bytes is not None else None

    def _token_text(self, token: int) -> tuple[str, bytes]:
        """A token's text (a split UTF-8 character shows as U+FFFD) and its bytes."""
        assert self.token_bytes is not None
        data = self.token_bytes(token)
        return data.decode("utf-8", errors="replace"), data

    def _logprobs(self, items: Sequence[TokenLogprob]) -> dict[str, Any]:
        raise NotImplementedError

    def _text_choice(self, text: str, first: bool) -> dict[str, Any]:
        raise NotImplementedError

    def _finish_choice(self, finish_reason: str) -> dict[str, Any]:
        raise NotImplementedError

    def _whole_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        raise NotImplementedError


class ChatFormat(ResponseFormat):
    """Chat completions; with a ``tool_parser``, tool calls are read out of the reply."""

    id_prefix = "chatcmpl"
    response_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(
        self,
        model_id: str,
        *,
        include_usage: bool,
        tool_parser: ToolCallParser | None = None,
        token_bytes: Callable[[int], bytes] | None = None,
        reasoning: ReasoningFormat | None = None,
        provenance: bool = False,
        response_id: str | None = None,
        left_out_messages: int = 0,
    ) -> None:
        super().__init__(
            model_id,
            include_usage=include_usage,
            token_bytes=token_bytes,
            provenance=provenance,
            response_id=response_id,
            left_out_messages=left_out_messages,
        )
        self.tool_parser = tool_parser
        # Set for a model that reasons aloud: its reasoning goes to reasoning_content.
        self.reasoning = reasoning

    @property
    def reasoning_marks(self) -> ReasoningFormat | None:
        """How this reply marks a thinking model's reasoning, if it does."""
        return self.reasoning

    def new_tally(self) -> GenerationTally:
        """A tally that splits the reply's reasoning from its answer, where there is any."""
        return GenerationTally(self.reasoning, left_out_messages=self.left_out_messages)

    def stream_chunks(self, event: GenerationEvent, tally: GenerationTally) -> list[dict[str, Any]]:
        """Plain text chunks; with tools, content and call deltas; reasoning apart."""
        parser = self.tool_parser
        if parser is None and self.reasoning is None:
            return super().stream_chunks(event, tally)
        self._pending_logprobs.extend(event.token_logprobs)
        split = tally.latest
        deltas: list[dict[str, Any]] = []
        if split.reasoning_text:
            deltas.append({"reasoning_content": split.reasoning_text})
        if parser is not None:
            # The parser sees the answer only: a call written while reasoning is not made.
            pieces = parser.feed(split.answer_text)
            if event.finish_reason is not None:
                pieces += parser.finish()
            deltas += _deltas(pieces)
        elif split.answer_text:
            deltas.append({"content": split.answer_text})
        chunks = []
        for delta in deltas:
            if self._first_chunk:
                delta = {"role": "assistant", "content": None, **delta}
                self._first_chunk = False
            chunks.append(self._chunk(_delta_choice(delta), tally))
        if self._first_chunk:
            # The first chunk goes out at once (clients see the reply has begun), even
            # while a possible call is still being read.
            chunks.append(self._chunk(_delta_choice({"role": "assistant", "content": None}), tally))
            self._first_chunk = False
        if event.finish_reason is not None:
            finish_reason = self._finish_reason(event.finish_reason)
            chunks.append(self._chunk(self._finish_choice(finish_reason), tally))
        return chunks

    def response(self, tally: GenerationTally) -> dict[str, Any]:
        """The whole response; the reply runs through the same parser as a stream's."""
        if self.tool_parser is None and self.reasoning is None:
            return super().response(tally)
        reply = self.parsed_reply(tally)
        calls = reply.tool_calls
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.content if reply.content or not calls else None,
            "refusal": None,
        }
        if tally.reasoning_text:
            # Where llama.cpp's server and vLLM put it; never inside content.
            message["reasoning_content"] = tally.reasoning_text
        if calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in calls
            ]
        return {
            **self._envelope(self.response_object),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    # Every generated token, the call syntax's included.
                    "logprobs": self._whole_logprobs(tally),
                    "finish_reason": self._finish_reason(tally.finish_reason),
                }
            ],
            "usage": tally.usage(),
            "draftpen": tally.draftpen(),
        }

    def parsed_reply(self, tally: GenerationTally) -> ParsedReply:
        """The whole answer read as a stream's is: its content and its tool calls."""
        reply = ParsedReply()
        parser = self.tool_parser
        if parser is not None:
            for piece in tally.pieces:
                reply.add(parser.feed(piece))
            reply.add(parser.finish())
        else:
            reply.add([ContentPiece(tally.text)])
        return reply

    def _finish_reason(self, finish_reason: str | None) -> str | None:
        # A reply that ended by itself after calling tools finished "to call tools";
        # one cut off by max_tokens or cancelled says so instead.
        if finish_reason == "stop" and self.tool_parser is not None and self.tool_parser.made_calls:
            return "tool_calls"
        return finish_reason

    def _logprobs(self, items: Sequence[TokenLogprob]) -> dict[str, Any]:
        """OpenAI's chat ``logprobs``: one entry per token, with its alternatives."""
        return {
            "content": [
                {
                    **self._token_entry(item.token, item.logprob),
                    "top_logprobs": [self._token_entry(t, lp) for t, lp in item.top],
                }
                for item in items
            ],
            "refusal": None,
        }

    def _token_entry(self, token: int, logprob: float) -> dict[str, Any]:
        text, data = self._token_text(token)
        return {"token": text, "logprob": wire_logprob(logprob), "bytes": list(data)}

    def _text_choice(self, text: str, first: bool) -> dict[str, Any]:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        return _delta_choice(delta)

    def _finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}

    def _whole_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "refusal": None}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}


def _delta_choice(delta: dict[str, Any]) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}


def _deltas(pieces: list[ParsedPiece]) -> list[dict[str, Any]]:
    """Stream deltas for parsed pieces: content, a call's start, its argument fragments.

    Neighbouring pieces of one kind are merged, so a round's text is one delta.
    """
    deltas: list[dict[str, Any]] = []
    for piece in pieces:
        last = deltas[-1] if deltas else None
        if isinstance(piece, ContentPiece):
            if last is not None and "content" in last and "tool_calls" not in last:
                last["content"] += piece.text
            else:
                deltas.append({"content": piece.text})
        elif isinstance(piece, ToolCallStart):
            call = {
                "index": piece.index,
                "id": piece.id,
                "type": "function",
                "function": {"name": piece.name, "arguments": ""},
            }
            deltas.append({"tool_calls": [call]})
        elif isinstance(piece, ArgumentsPiece):
            calls = last.get("tool_calls") if last is not None else None
            # A call's first delta keeps arguments "" (as OpenAI's); fragments follow it.
            if calls and calls[-1]["index"] == piece.index and "id" not in calls[-1]:
                calls[-1]["function"]["arguments"] += piece.text
            else:
                fragment = {"index": piece.index, "function": {"arguments": piece.text}}
                deltas.append({"tool_calls": [fragment]})
    return deltas


class CompletionFormat(ResponseFormat):
    """Text completions; logprobs in the legacy shape of parallel lists."""

    id_prefix = "cmpl"
    response_object = "text_completion"
    chunk_object = "text_completion"

    def __init__(
        self,
        model_id: str,
        *,
        include_usage: bool,
        token_bytes: Callable[[int], bytes] | None = None,
        provenance: bool = False,
        response_id: str | None = None,
    ) -> None:
        super().__init__(
            model_id,
            include_usage=include_usage,
            token_bytes=token_bytes,
            provenance=provenance,
            response_id=response_id,
        )
        # Where the next token's text starts in the completion (a stream's chunks go on
        # counting from where the previous one stopped).
        self._text_offset = 0

    def _logprobs(self, items: Sequence[TokenLogprob]) -> dict[str, Any]:
        """``tokens``, ``token_logprobs``, ``top_logprobs`` ({text: logprob}), ``text_offset``."""
        tokens: list[str] = []
        offsets: list[int] = []
        for item in items:
            text = self._token_text(item.token)[0]
            tokens.append(text)
            offsets.append(self._text_offset)
            self._text_offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [wire_logprob(item.logprob) for item in items],
            "top_logprobs": [
                {self._token_text(t)[0]: wire_logprob(lp) for t, lp in item.top} for item in items
            ],
            "text_offset": offsets,
        }

    def _text_choice(self, text: str, first: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": None}

    def _finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}

    def _whole_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


# What OpenAI reports for a token that has no probability at all (JSON has no -inf).
IMPOSSIBLE_LOGPROB = -9999.0


def wire_logprob(logprob: float) -> float:
    """A logprob as JSON can carry it: -inf (a token the filters removed) is -9999."""
    return logprob if math.isfinite(logprob) else IMPOSSIBLE_LOGPROB


def new_response_id(prefix: str) -> str:
    """A fresh response id, such as ``chatcmpl-…`` (OpenAI's shape)."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def sse_event(data: dict[str, Any] | str, name: str | None = None) -> str:
    """One server-sent event: ``data:`` (JSON, or a bare string), named when ``name``."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {payload}\n\n"
