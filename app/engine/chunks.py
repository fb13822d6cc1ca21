"""A response's shape, whatever the dialect: the whole response, stream chunks, SSE.

:class:`ResponseFormat` writes one request's answer from a tally of its events: the
whole response, or a stream's chunks, each carrying the running speculative statistics
in a ``draftpen`` field (and, for a draftpen client, the events' provenance segments).
Its ``sse_*`` hooks frame the stream as server-sent events; each dialect's format
subclasses it and says only how a choice looks (``dialects/openai_chat_format``,
``dialects/openai_completions``) or overrides the hooks to name its own events
(Messages, Responses).

When a request asks for logprobs, each choice carries the target's log-probabilities
of its tokens in the endpoint's shape. A stream sends each token's entry in the first
chunk that goes out after the token was generated, so the chunks' logprobs
concatenate to the whole response's, tool calls or not.
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
from backends.generation_events import GenerationEvent, TokenLogprob
from backends.output.reasoning import ReasoningFormat


class ResponseFormat:
    """OpenAI's response shapes for one request: the full response and stream chunks."""

    id_prefix = ""
    response_object = ""
    chunk_object = ""
    # Whether a stream sends a comment every second without news (reading a long
    # prompt, say). Agents send prompts of many thousand tokens, minutes of reading on
    # a CPU, and their HTTP stacks drop a silent stream (Node's fetch after 300 s,
    # Claude Code after its own idle limit); SSE readers skip comments.
    keep_alive = True

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
