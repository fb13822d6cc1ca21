"""OpenAI-compatible HTTP over a Unix socket, for local agents.

A small Starlette app served by uvicorn on a socket this module binds itself:
``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed as
server-sent events or not) and ``GET /health``. No TCP port is opened unless asked for.

Data flow: a handler validates the request (``schema``), renders and tokenizes
the prompt, and submits a :class:`~backends.engine.GenerationRequest` to the
:class:`~app.server.queue.GenerationQueue`, whose one worker thread runs the engine's
speculative loop. Events come back through an asyncio queue and are written out as
OpenAI chunks, each carrying the running speculative statistics in a ``draftpen``
field. A client that disconnects cancels its generation at the loop's next round.

Responses are shaped in ``chunks`` from a ``tally`` of the events; errors in
``http_errors``; the socket itself (path, modes, peer uid check, stale sockets) is
``unix_socket``, and running the server ``runner``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.server.chunks import ChatFormat, CompletionFormat, ResponseFormat, sse_event
from app.server.http_errors import (
    api_error_response,
    generation_error,
    http_error_response,
    internal_error_response,
)
from app.server.queue import (
    GenerationJob,
    GenerationQueue,
    QueueFullError,
    ShuttingDownError,
)
from app.server.schema import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationFields,
    NamedToolChoice,
    ResponseFormatField,
    parse_request,
)
from app.server.tally import GenerationTally
from app.settings import Settings
from backends.base import ToolSpec
from backends.chat_template import ChatTemplateError, model_chat_template, template_takes_tools
from backends.engine import Engine, GenerationRequest
from backends.output_constraints import ConstraintSpec, JsonOutput, ToolCallOutput
from backends.sampling import SamplingParams
from backends.tool_calls import ToolCallParser, tool_call_syntax

logger = logging.getLogger("draftpen.server")

T = TypeVar("T")

MAX_BODY_BYTES = 1 << 20
# An oversize body is read and thrown away up to this size, so the client gets its 413
# instead of a broken pipe; beyond it the connection is simply closed.
_DRAIN_LIMIT_BYTES = 32 << 20
RETRY_AFTER_SECONDS = 2


class AgentApi:
    """The request handlers of one server: one engine, one queue, one model id."""

    def __init__(
        self,
        engine: Engine,
        queue: GenerationQueue,
        *,
        model_id: str,
        settings: Settings,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.model_id = model_id
        self.settings = settings
        self.max_body_bytes = max_body_bytes
        self.created = int(time.time())

    def app(self) -> Starlette:
        """The ASGI application."""
        routes = [
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.get_model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
        ]
        return Starlette(
            routes=routes,
            exception_handlers={
                ApiError: api_error_response,
                HTTPException: http_error_response,
                Exception: internal_error_response,
            },
        )

    # -- endpoints -------------------------------------------------------------

    async def list_models(self, request: Request) -> Response:
        """``GET /v1/models``: the one model this server serves."""
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def get_model(self, request: Request) -> Response:
        """``GET /v1/models/{id}``."""
        self._check_model(request.path_params["model_id"])
        return JSONResponse(self._model_card())

    async def health(self, request: Request) -> Response:
        """``GET /health``: liveness, what is loaded, and what the queue is doing."""
        state = self.queue.state()
        return JSONResponse(
            {
                "status": "ok" if state.accepting else "shutting_down",
                "model": self.model_id,
                "target": self.engine.target.name,
                "draft": self.engine.draft.name if self.engine.draft is not None else None,
                "context": self.engine.target.n_ctx,
                "running": state.running,
                "waiting": state.waiting,
                "queue_limit": state.limit,
                "completed": state.completed,
                "cancelled": state.cancelled,
                "failed": state.failed,
            }
        )

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        parsed = parse_request(ChatCompletionRequest, await self._read_json(request))
        self._check_model(parsed.model)
        plan = self._reply_plan(parsed)
        try:
            # Tokenizing only reads the vocabulary, which llama.cpp allows while another
            # thread decodes (llama-server does the same); it runs off the event loop.
            prompt = await asyncio.to_thread(
                self.engine.chat_prompt, parsed.chat_messages(), plan.prompt_tools
            )
        except ChatTemplateError as error:
            raise ApiError(
                400,
                f"{error} Over the API, POST /v1/completions sends raw text instead.",
                param="messages",
                code="invalid_value",
            ) from None
        formatter = ChatFormat(
            self.model_id,
            include_usage=parsed.include_usage,
            tool_parser=plan.tool_parser,
            token_bytes=self._token_bytes(parsed),
        )
        return await self._respond(
            request, parsed, prompt, formatter, prompt_param="messages", constraint=plan.constraint
        )

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``: raw text in, no chat template."""
        parsed = parse_request(CompletionRequest, await self._read_json(request))
        self._check_model(parsed.model)
        if not parsed.prompt:
            raise ApiError(400, "The prompt is empty.", param="prompt", code="invalid_value")
        prompt = await asyncio.to_thread(self.engine.text_prompt, parsed.prompt)
        formatter = CompletionFormat(
            self.model_id, include_usage=parsed.include_usage, token_bytes=self._token_bytes(parsed)
        )
        return await self._respond(request, parsed, prompt, formatter, prompt_param="prompt")

    # -- the parts -------------------------------------------------------------

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "draftpen",
        }

    def _token_bytes(self, parsed: GenerationFields) -> Callable[[int], bytes] | None:
        """How the response writes a token's text, when the request asked for logprobs."""
        return self.engine.target.token_bytes if parsed.requested_logprobs is not None else None

    def _reply_plan(self, parsed: ChatCompletionRequest) -> _ReplyPlan:
        """What the prompt shows of the tools, how the reply is read, what it must be."""
        text = _json_output(parsed.response_format)
        tools = parsed.tool_specs
        choice = parsed.tool_choice
        if not tools or choice == "none":
            # "none": the model is not shown the tools, so it answers in text.
            return _ReplyPlan((), None, ConstraintSpec(text=text) if text else None)
        template = model_chat_template(self.engine.target)
        if not template_takes_tools(template):
            raise ApiError(
                400,
                f"The chat template of '{self.model_id}' does not show tools to the model, so "
                "it cannot call them. Leave tools out (or send tool_choice 'none'), or serve "
                "a pair whose template takes tools, such as starter.",
                param="tools",
                code="invalid_value",
            )
        syntax = tool_call_syntax(template)
        if syntax is None:
            raise ApiError(
                400,
                f"The chat template of '{self.model_id}' teaches a tool-call syntax draftpen "
                "does not read yet (it reads Hermes/Qwen <tool_call> blocks and Llama 3.1 JSON "
                "calls). Leave tools out or send tool_choice 'none', or serve another pair.",
                param="tools",
                code="invalid_value",
            )
        if isinstance(choice, NamedToolChoice):
            allowed = tuple(tool for tool in tools if tool.name == choice.function.name)
        else:
            allowed = tools
        mode = "auto" if choice in (None, "auto") else "required"
        parallel = parsed.parallel_tool_calls is not False
        parser = ToolCallParser(
            syntax, [tool.name for tool in tools], max_calls=None if parallel else 1
        )
        calls = ToolCallOutput(allowed, syntax, mode=mode, parallel=parallel)
        return _ReplyPlan(tools, parser, ConstraintSpec(text=text, tool_calls=calls))

    def _check_model(self, model: str) -> None:
        if model != self.model_id:
            raise ApiError(
                404,
                f"The model '{model}' is not served here; this server serves "
                f"'{self.model_id}' (see GET /v1/models). Start another draftpen serve "
                "with --pair and --socket for another pair.",
                param="model",
                code="model_not_found",
            )

    async def _read_json(self, request: Request) -> object:
        """The parsed JSON body; its size is checked as it arrives, before parsing."""
        body = bytearray()
        received = 0
        try:
            async for chunk in request.stream():
                received += len(chunk)
                if received > _DRAIN_LIMIT_BYTES:
                    break
                if received <= self.max_body_bytes:
                    body += chunk
        except ClientDisconnect:
            # Nobody will read the answer; this just ends the request without a traceback.
            raise ApiError(400, "The client disconnected while sending the request.") from None
        if received > self.max_body_bytes:
            raise ApiError(
                413,
                f"The request body is larger than {_size_text(self.max_body_bytes)}, the "
                "most this server accepts. Send a shorter prompt.",
                code="request_too_large",
            )
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as error:
            raise ApiError(
                400, f"The request body is not valid JSON: {error}.", code="invalid_json"
            ) from None

    def _generation_request(
        self,
        parsed: GenerationFields,
        prompt: list[int],
        prompt_param: str,
        constraint: ConstraintSpec | None,
    ) -> GenerationRequest:
        n_ctx = self.engine.target.n_ctx
        if len(prompt) >= n_ctx:
            raise ApiError(
                400,
                f"The prompt is {len(prompt)} tokens but this model's context holds {n_ctx}. "
                "Shorten it, or restart draftpen serve with a larger --context.",
                param=prompt_param,
                code="context_length_exceeded",
            )
        room = n_ctx - len(prompt)
        limit, limit_param = parsed.completion_limit
        if limit is not None and limit > room:
            raise ApiError(
                400,
                f"{limit_param} is {limit}, but after the {len(prompt)}-token prompt only "
                f"{room} tokens fit in this model's {n_ctx}-token context. Ask for at most "
                f"{room}, or restart draftpen serve with a larger --context.",
                param=limit_param,
                code="context_length_exceeded",
            )
        settings = self.settings
        speculative = parsed.speculative
        drafter = (speculative.drafter if speculative else None) or settings.drafter
        draft_tokens = speculative.k if speculative and speculative.k is not None else None
        if drafter == "model" and self.engine.draft is None:
            raise ApiError(
                400,
                f"'{self.model_id}' has no draft model, so speculative.drafter 'model' "
                "cannot run; use 'auto', 'ngram' or 'none'.",
                param="speculative.drafter",
                code="invalid_value",
            )
        try:
            params = SamplingParams(
                temperature=_given(parsed.temperature, settings.temperature),
                top_k=_given(parsed.top_k, settings.top_k),
                top_p=_given(parsed.top_p, settings.top_p),
                min_p=_given(parsed.min_p, settings.min_p),
                seed=parsed.seed,
            )
            return GenerationRequest(
                prompt_tokens=tuple(prompt),
                params=params,
                max_tokens=limit if limit is not None else room,
                drafter=drafter,
                draft_tokens=_given(draft_tokens, settings.draft_tokens),
                stop=parsed.stop,
                prediction=parsed.prediction.content if parsed.prediction else None,
                exact=(
                    speculative.exact
                    if speculative and speculative.exact is not None
                    else settings.exact_output
                ),
                constraint=constraint,
                logprobs=parsed.requested_logprobs,
            )
        except ValueError as error:
            raise ApiError(400, str(error), code="invalid_value") from None

    async def _respond(
        self,
        request: Request,
        parsed: GenerationFields,
        prompt: list[int],
        formatter: ResponseFormat,
        *,
        prompt_param: str,
        constraint: ConstraintSpec | None = None,
    ) -> Response:
        generation = self._generation_request(parsed, prompt, prompt_param, constraint)
        try:
            job = self.queue.submit(generation, asyncio.get_running_loop(), job_id=formatter.id)
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
        except ShuttingDownError:
            raise ApiError(
                503,
                "draftpen serve is shutting down; retry when it is back.",
                error_type="server_error",
                code="shutting_down",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None
        if parsed.stream:
            return _JobStreamResponse(self._stream(job, formatter), job, self.queue)
        return await self._collect(request, job, formatter)

    async def _stream(self, job: GenerationJob, formatter: ResponseFormat) -> AsyncIterator[str]:
        """Server-sent events for a job, in OpenAI's chunk format, then ``[DONE]``."""
        tally = GenerationTally()
        try:
            async for event in job.events():
                tally.add(event)
                for chunk in formatter.stream_chunks(event, tally):
                    yield sse_event(chunk)
        except Exception as error:
            # The status line is long gone: OpenAI reports such errors as an event.
            yield sse_event(generation_error(error).body())
            return
        if formatter.include_usage:
            yield sse_event(formatter.usage_chunk(tally))
        yield sse_event("[DONE]")

    async def _collect(
        self, request: Request, job: GenerationJob, formatter: ResponseFormat
    ) -> Response:
        """The whole answer of a job, cancelling it if the client goes away meanwhile."""
        tally = GenerationTally()
        failure: Exception | None = None
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._cancel_on_disconnect, request, job)
                try:
                    async for event in job.events():
                        tally.add(event)
                except Exception as error:
                    failure = error
                group.cancel_scope.cancel()
        finally:
            if not job.delivered:
                self.queue.cancel(job, "request handler stopped")
        if failure is not None:
            raise generation_error(failure)
        return JSONResponse(formatter.response(tally))

    async def _cancel_on_disconnect(self, request: Request, job: GenerationJob) -> None:
        # The body has been read, so the next message is the disconnect (if any).
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                self.queue.cancel(job, "client disconnected")
                return


class _JobStreamResponse(StreamingResponse):
    """A stream of server-sent events that cancels its job if it ends before the job.

    Starlette stops sending when the client disconnects (it cancels the stream); this
    catches that, and a disconnect before the first event, in one place.
    """

    def __init__(
        self, content: AsyncIterator[str], job: GenerationJob, queue: GenerationQueue
    ) -> None:
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


@dataclass(frozen=True)
class _ReplyPlan:
    """How a chat request's tools shape its prompt, its parsing and its constraint."""

    prompt_tools: tuple[ToolSpec, ...]
    tool_parser: ToolCallParser | None
    constraint: ConstraintSpec | None


def _json_output(response_format: ResponseFormatField | None) -> JsonOutput | None:
    """The JSON a ``response_format`` asks for; None for text."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.json_schema is None:
        return JsonOutput()  # json_object: any JSON object
    spec = response_format.json_schema
    return JsonOutput(schema=spec.schema_, strict=bool(spec.strict), name=spec.name)


def _size_text(size: int) -> str:
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    return f"{size} bytes"


def _given(value: T | None, default: T) -> T:
    return default if value is None else value
