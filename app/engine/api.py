"""The engine's HTTP face: its routes, and the one chat path every dialect takes.

A small Starlette app served by uvicorn on a Unix socket: ``GET /v1/models`` (the
downloaded pairs, each with a ``loaded`` flag), ``POST /v1/chat/completions``,
``POST /v1/completions``, the Messages and Responses routes (``dialects/``), ``GET
/health``, and for draftpen's clients ``POST /draftpen/load`` (load or reload a pair,
progress streamed) and ``GET /draftpen/attach`` (held open by a front end, so an engine
started with ``--idle-exit`` knows someone uses it). No TCP port is opened unless asked
for, and there every request must carry the engine's API key (``api_key_check``).

Data flow: a handler reads the body (``request_body``), validates it in its dialect's
request model (``dialects/openai_chat_schema``, ``dialects/openai_completions``,
``dialects/anthropic_schema``, ``dialects/responses_request``: the chat dialects all
become one :class:`ChatCompletionRequest` and are answered by :meth:`respond_chat`),
checks that its ``model`` names a downloaded pair (``pairs``), and submits a job to the
:class:`~app.engine.queue.GenerationQueue`. Its one worker thread loads the pair if it
is not in memory (``scheduler``), runs the job's ``prepare`` against it (the prompt and
the :class:`~backends.engine.GenerationRequest`, ``job_requests``), and runs the
engine's speculative loop. ``job_responses`` writes the items that come back as the
dialect's format (``chunks``' :class:`ResponseFormat` and its subclasses in
``dialects/``) from a ``tally`` of the events: whole or streamed, with the ``draftpen``
statistics, provenance segments and queue and loading notices for draftpen's clients
(``app.client.wire`` defines those shapes). A plain OpenAI client's stream starts once
its request is prepared, so a bad request still gets its 4xx status; a client that
disconnects cancels its generation at the loop's next round. Errors are answered by
``http_errors``; the socket is ``unix_socket``, and running the server ``runner``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.client.wire import (
    API_VERSION,
    SERVICE,
    DraftpenRequestOptions,
    HealthReport,
    LoadRequest,
    PairCard,
    QueueReport,
    RuntimeReport,
)
from app.engine import crash_record
from app.engine.choices import answer_choices
from app.engine.chunks import ResponseFormat, new_response_id
from app.engine.dialects.anthropic_messages import anthropic_routes
from app.engine.dialects.openai_chat_format import ChatFormat
from app.engine.dialects.openai_chat_schema import ChatCompletionRequest
from app.engine.dialects.openai_completions import CompletionFormat, CompletionRequest
from app.engine.dialects.openai_responses import responses_routes
from app.engine.engine_parts import HeldPairs, JobQueue
from app.engine.generation_run import END
from app.engine.http_errors import (
    api_error_response,
    generation_error,
    http_error_response,
    internal_error_response,
)
from app.engine.job_requests import (
    ChatFormatFactory,
    ChatTokenCount,
    chat_preparer,
    completion_preparer,
    given,
)
from app.engine.job_responses import JobResponses
from app.engine.jobs import (
    EngineJob,
    Inspected,
    Preparer,
    QueueFullError,
    RuntimeStoppedError,
    ShuttingDownError,
)
from app.engine.pairs import PairDirectory, model_not_found
from app.engine.request_body import MAX_BODY_BYTES, read_json_body
from app.engine.scheduler import LoadOptions
from app.engine.schema import ApiError, GenerationFields, parse_request
from app.engine.worker_options import workers_named
from app.settings import Settings

logger = logging.getLogger("draftpen.server")

RETRY_AFTER_SECONDS = 2


def engine_version() -> str:
    """draftpen's version, as installed."""
    try:
        return importlib.metadata.version("draftpen")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


class AgentApi:
    """The request handlers of one engine: its pairs, its scheduler, its queue."""

    def __init__(
        self,
        scheduler: HeldPairs,
        queue: JobQueue,
        *,
        pairs: PairDirectory,
        settings: Settings,
        max_body_bytes: int = MAX_BODY_BYTES,
        idle_exit: bool = False,
        runtime: Callable[[], RuntimeReport] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.queue = queue
        self.pairs = pairs
        self.settings = settings
        self.max_body_bytes = max_body_bytes
        self.idle_exit = idle_exit
        self.created = int(time.time())
        self.version = engine_version()
        self.responses = JobResponses(queue)
        # The runtime process's state, where the runtime runs in one (GET /health).
        self.runtime = runtime
        # http://HOST:PORT once the server listens on TCP too (for GET /health).
        self.tcp_url: str | None = None
        # Front ends holding GET /draftpen/attach open, and when the last one left.
        self.attached = 0
        self.detached_at = time.monotonic()
        self._closing: asyncio.Event | None = None

    def app(self) -> Starlette:
        """The ASGI application."""
        routes = [
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.get_model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            *anthropic_routes(self),
            *responses_routes(self),
            Route("/health", self.health, methods=["GET"]),
            Route("/draftpen/load", self.load, methods=["POST"]),
            Route("/draftpen/attach", self.attach, methods=["GET"]),
        ]
        return Starlette(
            routes=routes,
            exception_handlers={
                ApiError: api_error_response,
                HTTPException: http_error_response,
                Exception: internal_error_response,
            },
        )

    def close_attachments(self) -> None:
        """End every attach stream (the server is stopping); call on the event loop."""
        if self._closing is not None:
            self._closing.set()

    # -- endpoints -------------------------------------------------------------

    async def list_models(self, request: Request) -> Response:
        """``GET /v1/models``: the downloaded pairs, and which one is loaded."""
        cards = await asyncio.to_thread(self._model_cards)
        return JSONResponse({"object": "list", "data": cards})

    async def get_model(self, request: Request) -> Response:
        """``GET /v1/models/{id}``."""
        model_id = request.path_params["model_id"]
        for card in await asyncio.to_thread(self._model_cards):
            if card["id"] == model_id:
                return JSONResponse(card)
        await asyncio.to_thread(self.pairs.check, model_id)
        raise model_not_found(f"The model '{model_id}' is not downloaded (GET /v1/models).")

    async def health(self, request: Request) -> Response:
        """``GET /health``: who answers, what is loaded, and what the queue is doing."""
        state = self.queue.state()
        # Off the event loop: with the runtime in its own process, this asks it.
        held = await asyncio.to_thread(self.scheduler.snapshot)
        report = HealthReport(
            service=SERVICE,
            status="ok" if state.accepting else "shutting_down",
            version=self.version,
            api_version=API_VERSION,
            pid=os.getpid(),
            loaded=list(held.loaded),
            loading=held.loading,
            loads=self.scheduler.loads,
            queue=QueueReport(
                running=state.running_label,
                running_id=state.running,
                waiting=state.waiting,
                limit=state.limit,
                completed=state.completed,
                cancelled=state.cancelled,
                failed=state.failed,
                running_count=state.running_count,
                parallel=state.parallel,
                parallel_refusal=state.parallel_refusal,
            ),
            attached_clients=self.attached,
            keep_alive_seconds=self.scheduler.keep_alive,
            idle_exit=self.idle_exit,
            tcp=self.tcp_url,
            previous_crash=crash_record.previous_crash(),
            runtime=self.runtime() if self.runtime is not None else None,
        )
        return JSONResponse(report.model_dump())

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        parsed = parse_request(ChatCompletionRequest, await self.read_json(request))
        if parsed.choices > 1:
            return await answer_choices(request, parsed, self.respond_chat)
        return await self.respond_chat(request, parsed, ChatFormat)

    async def respond_chat(
        self,
        request: Request,
        parsed: ChatCompletionRequest,
        make_format: ChatFormatFactory,
        *,
        response_id: str | None = None,
    ) -> Response:
        """Answer one chat request, whatever dialect it came in, in ``make_format``'s shape.

        The one internal request of every chat dialect is a validated
        :class:`ChatCompletionRequest`: the Messages and Responses adapters translate
        theirs into one and come here, so the prompt, the tools' grammar, the limits,
        the queue and the loop are the same code for all of them; only the shape of
        the answer (``make_format``, called with :class:`ChatFormat`'s arguments)
        differs.
        """
        await asyncio.to_thread(self.pairs.check, parsed.model)
        options = parsed.draftpen or DraftpenRequestOptions()
        response_id = response_id or new_response_id(make_format.id_prefix)

        prepare = chat_preparer(parsed, make_format, self.settings, options, response_id)

        def fallback() -> ResponseFormat:
            return make_format(
                parsed.model, include_usage=parsed.include_usage, response_id=response_id
            )

        return await self._respond(request, parsed, options, response_id, prepare, fallback)

    async def count_chat_tokens(self, parsed: ChatCompletionRequest) -> int:
        """How many tokens ``parsed``'s prompt is, rendered as :meth:`respond_chat` would.

        Run on the engine's worker (the pair loaded if need be): the model's own chat
        template, the tools as the prompt shows them, the thinking switch.
        """
        await asyncio.to_thread(self.pairs.check, parsed.model)
        job = EngineJob(
            id=new_response_id("count"),
            pair=parsed.model,
            kind="token count",
            loop=asyncio.get_running_loop(),
            inspect=ChatTokenCount(parsed, self.settings),
        )
        self._submit(job)
        try:
            while True:
                item = await job.next_item()
                if isinstance(item, Inspected):
                    return int(item.result)
                if isinstance(item, BaseException):
                    raise generation_error(item)
                if item is END:
                    raise ApiError(503, "The engine stopped before counting.", code="cancelled")
        finally:
            if not job.delivered:
                self.queue.cancel(job, "request handler stopped")

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``: raw text in, no chat template."""
        parsed = parse_request(CompletionRequest, await self.read_json(request))
        await asyncio.to_thread(self.pairs.check, parsed.model)
        if not parsed.prompt:
            raise ApiError(400, "The prompt is empty.", param="prompt", code="invalid_value")
        options = parsed.draftpen or DraftpenRequestOptions()
        response_id = new_response_id(CompletionFormat.id_prefix)

        prepare = completion_preparer(parsed, self.settings, options, response_id)

        def fallback() -> ResponseFormat:
            return CompletionFormat(
                parsed.model, include_usage=parsed.include_usage, response_id=response_id
            )

        return await self._respond(request, parsed, options, response_id, prepare, fallback)

    async def load(self, request: Request) -> Response:
        """``POST /draftpen/load``: load a pair (or reload it with other settings).

        Always a stream: loading notices, then ``{"draftpen": {"loaded": {...}}}`` and
        ``[DONE]``; a failure is an error event. Jobs ahead of it finish first.
        """
        body = await self.read_json(request)
        try:
            wanted = LoadRequest.model_validate(body)
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            param = ".".join(str(part) for part in first["loc"]) or None
            raise ApiError(
                400,
                f"Invalid load request: {param}: {first['msg']}. Send "
                '{"pair": NAME, "files": {"target": PATH, "draft": PATH}, "context_length": '
                'N, "exact": true|false, "workers": ["HOST:PORT", ...]} (all but the pair '
                "optional).",
                param=param,
                code="invalid_value",
            ) from None
        shared = None
        if wanted.files is not None:  # a client's --target/--draft: this engine never saw it
            files = wanted.files
            shared = await asyncio.to_thread(
                self.pairs.share, wanted.pair, files.target, files.draft
            )
        await asyncio.to_thread(self.pairs.check, wanted.pair)
        options = None
        changes = (wanted.context_length, wanted.exact, wanted.workers)
        if any(change is not None for change in changes):
            base = self.scheduler.options_for(wanted.pair)
            options = LoadOptions(
                context_length=given(wanted.context_length, base.context_length),
                exact=given(wanted.exact, base.exact),
                parallel=base.parallel,
                workers=base.workers if wanted.workers is None else workers_named(wanted.workers),
            )
        job = EngineJob(
            id=new_response_id("load"),
            pair=wanted.pair,
            kind="load",
            loop=asyncio.get_running_loop(),
            load_options=options,
            command_line_pair=shared,
        )
        self._submit(job)
        return self.responses.load_progress(job)

    async def attach(self, request: Request) -> Response:
        """``GET /draftpen/attach``: held open by a front end for as long as it runs."""
        if self._closing is None:
            self._closing = asyncio.Event()
        closing = self._closing

        async def held() -> AsyncIterator[str]:
            self.attached += 1
            try:
                yield ": attached\n\n"
                await closing.wait()
            finally:
                self.attached -= 1
                self.detached_at = time.monotonic()

        return StreamingResponse(held(), media_type="text/event-stream")

    # -- the parts -------------------------------------------------------------

    def _model_cards(self) -> list[dict[str, Any]]:
        loaded = self.scheduler.loaded_name()
        return [
            PairCard(
                id=pair.name,
                created=self.created,
                loaded=pair.name == loaded,
                target=pair.target,
                draft=pair.draft,
            ).model_dump()
            for pair in self.pairs.downloaded()
        ]

    async def read_json(self, request: Request) -> object:
        """The parsed JSON body of ``request``; its size is checked as it arrives."""
        return await read_json_body(request, self.max_body_bytes)

    def _submit(self, job: EngineJob) -> None:
        try:
            self.queue.submit(job)
        except QueueFullError:
            state = self.queue.state()
            raise ApiError(
                503,
                f"The server is busy: one request is generating and {state.waiting} wait "
                f"(the limit is {state.limit}; draftpen serve --queue N raises it). "
                f"Retry in {RETRY_AFTER_SECONDS} seconds.",
                error_type="server_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None
        except RuntimeStoppedError as stopped:
            raise ApiError(
                503, str(stopped), error_type="server_error", code="runtime_stopped"
            ) from None
        except ShuttingDownError:
            raise ApiError(
                503,
                "draftpen serve is shutting down; retry when it is back.",
                error_type="server_error",
                code="shutting_down",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None

    async def _respond(
        self,
        request: Request,
        parsed: GenerationFields,
        options: DraftpenRequestOptions,
        response_id: str,
        prepare: Preparer,
        fallback: Callable[[], ResponseFormat],
    ) -> Response:
        job = EngineJob(
            id=response_id,
            pair=parsed.model,
            kind=options.client,
            loop=asyncio.get_running_loop(),
            prepare=prepare,
        )
        self._submit(job)
        return await self.responses.answer(
            request, job, fallback, stream=parsed.stream, progress=options.progress
        )
