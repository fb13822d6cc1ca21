"""OpenAI's response shapes: the whole response, stream chunks and server-sent events.

Chat completions and text completions differ only in how a choice looks; both carry
the running speculative statistics in a ``draftpen`` field.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from app.server.tally import GenerationTally
from backends.speculative import GenerationEvent


class ResponseFormat:
    """OpenAI's response shapes for one request: the full response and stream chunks."""

    id_prefix = ""
    response_object = ""
    chunk_object = ""

    def __init__(self, model_id: str, *, include_usage: bool) -> None:
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model_id = model_id
        self.include_usage = include_usage
        self._first_chunk = True

    def _envelope(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model_id,
            "system_fingerprint": None,
        }

    def _chunk(self, choice: dict[str, Any], tally: GenerationTally) -> dict[str, Any]:
        chunk = {**self._envelope(self.chunk_object), "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI: only the last chunk carries usage
        chunk["draftpen"] = tally.draftpen()
        return chunk

    def stream_chunks(self, event: GenerationEvent, tally: GenerationTally) -> list[dict[str, Any]]:
        """The chunks for one event: its text (if any), then the finish (if it is the last)."""
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
        return {
            **self._envelope(self.response_object),
            "choices": [self._whole_choice(tally.text, tally.finish_reason)],
            "usage": tally.usage(),
            "draftpen": tally.draftpen(),
        }

    def _text_choice(self, text: str, first: bool) -> dict[str, Any]:
        raise NotImplementedError

    def _finish_choice(self, finish_reason: str) -> dict[str, Any]:
        raise NotImplementedError

    def _whole_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        raise NotImplementedError


class ChatFormat(ResponseFormat):
    id_prefix = "chatcmpl"
    response_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def _text_choice(self, text: str, first: bool) -> dict[str, Any]:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}

    def _finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}

    def _whole_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "refusal": None}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}


class CompletionFormat(ResponseFormat):
    id_prefix = "cmpl"
    response_object = "text_completion"
    chunk_object = "text_completion"

    def _text_choice(self, text: str, first: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": None}

    def _finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}

    def _whole_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def sse_event(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"
