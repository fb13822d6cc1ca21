"""How a job's items become an HTTP answer: a stream of server-sent events, or one body.

A job (``queue``) delivers queue and loading notices, its prepared request's response
format, the loop's events, then an end marker or an error. :class:`JobResponses` turns
them into OpenAI's shapes (``chunks``): a streamed answer, with notices and a keep-alive
comment every second for a client that asked for progress; for a plain OpenAI client a
stream that starts once the request is prepared, so an error found then still gets its
status; or the whole body at the end. A client that goes away cancels its job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.client.wire import QueueNotice
from app.engine.chunks import ResponseFormat, sse_event
from app.engine.engine_parts import JobQueue
from app.engine.generation_run import END
from app.engine.http_errors import generation_error
from app.engine.jobs import EngineJob, LoadedNotice, LoadingNotice, Prepared
from backends.generation_events import GenerationEvent

# A stream that asked for progress gets a comment after this long without news.
HEARTBEAT_SECONDS = 1.0


class JobResponses:
    """The answers of one engine's jobs."""

    def __init__(self, queue: JobQueue) -> None:
        self.queue = queue

    async def answer(
        self,
        request: Request,
        job: EngineJob,
        fallback: Callable[[], ResponseFormat],
        *,
        stream: bool,
        progress: bool,
    ) -> Response:
        """The answer to a generation job; ``fallback`` shapes it if the job never ran."""
        if not stream:
            return await self._collect(request, job, fallback)
        if progress:
            # A draftpen client: notices flow at once, a late error is an error event.
            return JobStreamResponse(self._stream(job, fallback(), progress=True), job, self.queue)
        # A plain OpenAI client: its stream starts once the request is prepared, so an
        # error found then (a prompt too long for the context) still gets its status.
        prepared = await self._until_prepared(request, job)
        formatter = prepared.extras if prepared is not None else fallback()
        return JobStreamResponse(self._stream(job, formatter), job, self.queue)

    def load_progress(self, job: EngineJob) -> Response:
        """The answer to a load job: a stream of its progress, then what was loaded."""
        return JobStreamResponse(self._load_stream(job), job, self.queue)

    async def _until_prepared(self, request: Request, job: EngineJob) -> Prepared | None:
        """Wait (through queue and load) until the job's request is built; None if the
        job ended first (cancelled). Raises the job's error as an API error."""
        outcome: Prepared | BaseException | None = None
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._cancel_on_disconnect, request, job)
                while outcome is None:
                    item = await job.next_item()
                    if isinstance(item, Prepared | BaseException):
                        outcome = item
                    elif item is END or isinstance(item, GenerationEvent):
                        break
                group.cancel_scope.cancel()
        finally:
            if isinstance(outcome, BaseException) or (outcome is None and not job.delivered):
                self.queue.cancel(job, "request handler stopped")
        if isinstance(outcome, BaseException):
            raise generation_error(outcome)
        return outcome

    async def _stream(
        self, job: EngineJob, formatter: ResponseFormat, *, progress: bool = False
    ) -> AsyncIterator[str]:
        """Server-sent events for a job, in OpenAI's chunk format, then ``[DONE]``.

        With ``progress``, queue and loading notices are chunks too, and a comment goes
        out every second without news, so the client knows the engine is alive; a
        format that asks for them (``keep_alive``) gets the comments too.
        """
        tally = formatter.new_tally()
        heartbeat = HEARTBEAT_SECONDS if progress or formatter.keep_alive else None
        opened = False
        try:
            async for item in _items(job, heartbeat):
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    yield ": keep-alive\n\n"
                elif isinstance(item, Prepared):
                    # Before any event: the tally reads the reply as the format does.
                    formatter = item.extras
                    tally = formatter.new_tally()
                elif isinstance(item, QueueNotice | LoadingNotice):
                    if progress:
                        yield sse_event(formatter.notice_chunk(_notice_fields(item)))
                elif isinstance(item, GenerationEvent):
                    if not opened:
                        opened = True
                        for opening in formatter.sse_open():
                            yield opening
                    tally.add(item)
                    for event in formatter.sse_events(item, tally):
                        yield event
        except Exception as error:
            # The status line is long gone: the dialect reports such errors as an event.
            for event in formatter.sse_error(generation_error(error)):
                yield event
            return
        if not opened:
            for opening in formatter.sse_open():
                yield opening
        for event in formatter.sse_close(tally):
            yield event

    async def _load_stream(self, job: EngineJob) -> AsyncIterator[str]:
        """The events of a load job: notices, then what was loaded, then ``[DONE]``."""
        try:
            async for item in _items(job, HEARTBEAT_SECONDS):
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    yield ": keep-alive\n\n"
                elif isinstance(item, QueueNotice | LoadingNotice):
                    yield sse_event({"draftpen": _notice_fields(item)})
                elif isinstance(item, LoadedNotice):
                    loaded = {"loaded": item.report.model_dump(), "fresh": item.fresh}
                    yield sse_event({"draftpen": loaded})
        except Exception as error:
            yield sse_event(generation_error(error).body())
            return
        yield sse_event("[DONE]")

    async def _collect(
        self, request: Request, job: EngineJob, fallback: Callable[[], ResponseFormat]
    ) -> Response:
        """The whole answer of a job, cancelling it if the client goes away meanwhile."""
        formatter = fallback()
        tally = formatter.new_tally()
        failure: BaseException | None = None
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._cancel_on_disconnect, request, job)
                async for item in _items(job):
                    if isinstance(item, BaseException):
                        failure = item
                        break
                    if isinstance(item, Prepared):
                        # Before any event: the tally reads the reply as the format does.
                        formatter = item.extras
                        tally = formatter.new_tally()
                    elif isinstance(item, GenerationEvent):
                        tally.add(item)
                group.cancel_scope.cancel()
        finally:
            if not job.delivered:
                self.queue.cancel(job, "request handler stopped")
        if failure is not None:
            raise generation_error(failure)
        return JSONResponse(formatter.response(tally))

    async def _cancel_on_disconnect(self, request: Request, job: EngineJob) -> None:
        # The body has been read, so the next message is the disconnect (if any).
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                self.queue.cancel(job, "client disconnected")
                return


async def _items(job: EngineJob, heartbeat: float | None = None) -> AsyncIterator[Any]:
    """What the job sends, up to its end: events, notices, a failure (an exception, as an
    item), and None where ``heartbeat`` seconds passed with no news."""
    while True:
        item = await job.next_item(heartbeat)
        if item is END:
            return
        yield item


def _notice_fields(notice: QueueNotice | LoadingNotice) -> dict[str, Any]:
    """A notice as the ``draftpen`` object of its chunk."""
    if isinstance(notice, QueueNotice):
        return {"queue": notice.model_dump()}
    return {"loading": notice.text}


class JobStreamResponse(StreamingResponse):
    """A stream of server-sent events that cancels its job if it ends before the job.

    Starlette stops sending when the client disconnects (it cancels the stream); this
    catches that, and a disconnect before the first event, in one place.
    """

    def __init__(self, content: AsyncIterator[str], job: EngineJob, queue: JobQueue) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.job = job
        self.queue = queue

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.job.delivered:
                self.queue.cancel(self.job, "client disconnected")
