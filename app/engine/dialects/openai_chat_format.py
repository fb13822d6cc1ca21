"""OpenAI Chat Completions' answer: a whole ``chat.completion`` or its stream chunks.

:class:`ChatFormat` is the chat answer every dialect starts from (Messages and Responses
subclass it). A reply to a request with tools runs through a
:class:`~backends.output.tool_calls.ToolCallParser`, streaming or not: its calls become
``tool_calls`` (``delta.tool_calls`` in a stream, as OpenAI sends them: index, id, type
and name first, then ``arguments`` fragments), and ``finish_reason`` is
``"tool_calls"``. A thinking model's reasoning goes to ``reasoning_content``, never
inside ``content``. Logprobs are ``logprobs.content``: one entry per token with its
text, bytes and ``top_logprobs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.engine.chunks import ResponseFormat, wire_logprob
from app.engine.tally import GenerationTally
from backends.generation_events import GenerationEvent, TokenLogprob
from backends.output.reasoning import ReasoningFormat
from backends.output.tool_call_pieces import (
    ArgumentsPiece,
    ContentPiece,
    ParsedPiece,
    ParsedReply,
    ToolCallStart,
)
from backends.output.tool_calls import ToolCallParser


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
