"""Chat completions with ``n`` > 1: several choices, generated one after another.

Each choice is a whole request of its own through the one chat path
(:meth:`~app.engine.api.AgentApi.respond_chat`): its own job in the queue, its own
generation, the conversation cache reading the shared prompt once. Choice ``i`` samples
with ``seed + i`` when the request has a seed, so a seeded request gets different
choices that are the same on every run. The answers are then put together as OpenAI
shapes them: one response whose ``choices`` are indexed 0..n-1, or one stream whose
chunks carry each choice's ``index``, choice after choice, with one usage chunk (when
asked) and one ``[DONE]`` at the end. Usage counts the prompt once, as OpenAI does,
and the completions of every choice.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.engine.chunks import new_response_id, sse_event
from app.engine.dialects.openai_chat_format import ChatFormat
from app.engine.dialects.openai_chat_schema import ChatCompletionRequest
from app.engine.job_responses import JobStreamResponse
from app.engine.schema import ApiError
from app.engine.tally import GenerationTally

# Answers one choice's request in the given format: AgentApi.respond_chat.
RespondChat = Callable[..., Awaitable[Response]]


def choice_request(parsed: ChatCompletionRequest, index: int) -> ChatCompletionRequest:
    """The request of choice ``index``: one choice, and its own seed when one was sent."""
    update: dict[str, Any] = {"n": 1}
    if parsed.seed is not None:
        update["seed"] = parsed.seed + index
    return parsed.model_copy(update=update)


def sum_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """One usage block for several choices of one prompt.

    The prompt (and what of it was cached) counts once, as OpenAI counts it for ``n``;
    the completions, and their details, add up.
    """
    first = usages[0]
    completion = sum(usage["completion_tokens"] for usage in usages)
    details: dict[str, int] = {}
    for usage in usages:
        for name, count in (usage.get("completion_tokens_details") or {}).items():
            details[name] = details.get(name, 0) + int(count)
    return {
        **first,
        "completion_tokens": completion,
        "total_tokens": first["prompt_tokens"] + completion,
        "completion_tokens_details": details,
    }


class _Series:
    """What the choices of one streamed request leave for its closing chunk."""

    def __init__(self) -> None:
        self.usage_chunks: list[dict[str, Any]] = []


def _choice_format(index: int, series: _Series) -> type[ChatFormat]:
    """:class:`ChatFormat` for choice ``index`` of a stream: its chunks carry ``index``,
    and it closes without usage or ``[DONE]``, which the series sends once at the end."""

    class OneChoiceFormat(ChatFormat):
        def _chunk(self, choice: dict[str, Any], tally: GenerationTally) -> dict[str, Any]:
            choice["index"] = index
            return super()._chunk(choice, tally)

        def sse_close(self, tally: GenerationTally) -> list[str]:
            series.usage_chunks.append(self.usage_chunk(tally))
            return []

    return OneChoiceFormat


async def answer_choices(
    request: Request, parsed: ChatCompletionRequest, respond_chat: RespondChat
) -> Response:
    """The answer to a chat request with ``n`` > 1: its choices, one after another."""
    response_id = new_response_id(ChatFormat.id_prefix)
    if not parsed.stream:
        bodies = []
        for index in range(parsed.choices):
            answer = await respond_chat(
                request, choice_request(parsed, index), ChatFormat, response_id=response_id
            )
            assert isinstance(answer, JSONResponse)
            body = json.loads(bytes(answer.body))
            body["choices"][0]["index"] = index
            bodies.append(body)
        return JSONResponse(
            {
                **bodies[-1],
                "choices": [body["choices"][0] for body in bodies],
                "usage": sum_usage([body["usage"] for body in bodies]),
            }
        )
    series = _Series()
    # The first choice is answered before the status line goes out, so a request the
    # engine refuses (a prompt too long for the context) still gets its 4xx.
    first = await respond_chat(
        request, choice_request(parsed, 0), _choice_format(0, series), response_id=response_id
    )
    assert isinstance(first, JobStreamResponse)
    return _ChoicesStream(_events(request, parsed, respond_chat, first, series, response_id))


async def _events(
    request: Request,
    parsed: ChatCompletionRequest,
    respond_chat: RespondChat,
    first: JobStreamResponse,
    series: _Series,
    response_id: str,
) -> AsyncIterator[str | _NowRunning]:
    """The events of every choice's stream, then one usage chunk and ``[DONE]``."""
    answer = first
    for index in range(parsed.choices):
        if index > 0:
            try:
                answer = await respond_chat(
                    request,
                    choice_request(parsed, index),
                    _choice_format(index, series),
                    response_id=response_id,
                )
            except ApiError as error:
                # The status line went out with the first choice: report it in the stream.
                yield sse_event(error.body())
                return
            assert isinstance(answer, JobStreamResponse)
        yield _NowRunning(answer)
        closed = len(series.usage_chunks)
        async for event in answer.body_iterator:
            yield event if isinstance(event, str) else bytes(event).decode()
        if len(series.usage_chunks) == closed:
            return  # the choice ended in an error event: no more choices
    if parsed.include_usage and series.usage_chunks:
        usage = sum_usage([chunk["usage"] for chunk in series.usage_chunks])
        yield sse_event({**series.usage_chunks[-1], "usage": usage})
    yield sse_event("[DONE]")


class _NowRunning:
    """A marker in the events: from here on they are ``answer``'s (its job runs)."""

    def __init__(self, answer: JobStreamResponse) -> None:
        self.answer = answer


class _ChoicesStream(StreamingResponse):
    """The stream of all choices; a client that leaves cancels the choice running."""

    def __init__(self, events: AsyncIterator[str | _NowRunning]) -> None:
        self.running: JobStreamResponse | None = None
        super().__init__(
            self._text(events),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _text(self, events: AsyncIterator[str | _NowRunning]) -> AsyncIterator[str]:
        async for event in events:
            if isinstance(event, _NowRunning):
                self.running = event.answer
            else:
                yield event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            running = self.running
            if running is not None and not running.job.delivered:
                running.queue.cancel(running.job, "client disconnected")
