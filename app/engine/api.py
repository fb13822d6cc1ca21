"""The engine's HTTP face: OpenAI-compatible routes, and draftpen's own, on a Unix socket.

A small Starlette app served by uvicorn: ``GET /v1/models`` (the downloaded pairs, each
with a ``loaded`` flag), ``POST /v1/chat/completions``, ``POST /v1/completions``
(streamed as server-sent events or not), ``GET /health``, and for draftpen's clients
``POST /draftpen/load`` (load or reload a pair, progress streamed) and
``GET /draftpen/attach`` (a connection held open by a front end, so an engine started
with ``--idle-exit`` knows someone uses it). No TCP port is opened unless asked for,
and there every request must carry the engine's API key (``api_key_check``).

Data flow: a handler validates the request (``schema``) and checks that its ``model``
names a downloaded pair (``pairs``), then submits a job to the
:class:`~app.engine.queue.GenerationQueue`. Its one worker thread loads the pair if it
is not in memory (``scheduler``), renders and tokenizes the prompt against it (the
job's ``prepare``), and runs the engine's speculative loop. Items come back through an
asyncio queue and are written out as OpenAI chunks, each carrying the running
speculative statistics in a ``draftpen`` field; a request whose ``draftpen`` field asks
for them also gets provenance segments, and queue and loading notices while it waits
(``app.client.wire`` defines those shapes; ``job_responses`` writes the answers). A
plain OpenAI client's stream starts once its request is prepared, so a bad request still
gets its 4xx status. A client that disconnects cancels its generation at the loop's
next round.

Responses are shaped in ``chunks`` from a ``tally`` of the events; errors in
``http_errors``; the socket itself (path, modes, peer uid check, stale sockets) is
``unix_socket``, and running the server ``runner``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.chats.conversation import fit_conversation
from app.client.wire import (
    API_VERSION,
    SERVICE,
    DraftpenRequestOptions,
    HealthReport,
    LoadRequest,
    PairCard,
    QueueReport,
)
from app.engine.choices import answer_choices
from app.engine.chunks import ResponseFormat, new_response_id
from app.engine.dialects.anthropic_messages import anthropic_routes
from app.engine.dialects.openai_chat_format import ChatFormat
from app.engine.dialects.openai_chat_schema import (
    ChatCompletionRequest,
    NamedToolChoice,
    ResponseFormatField,
)
from app.engine.dialects.openai_completions import CompletionFormat, CompletionRequest
from app.engine.dialects.openai_responses import responses_routes
from app.engine.http_errors import (
    api_error_response,
    generation_error,
    http_error_response,
    internal_error_response,
)
from app.engine.job_responses import JobResponses
from app.engine.pairs import PairDirectory, model_not_found
from app.engine.queue import (
    END,
    EngineJob,
    GenerationQueue,
    Inspected,
    Prepared,
    Preparer,
    QueueFullError,
    ShuttingDownError,
)
from app.engine.scheduler import LoadOptions, PairScheduler
from app.engine.schema import ApiError, GenerationFields, parse_request
from app.settings import Settings
from backends.base import ToolSpec
from backends.call_syntax import tool_call_syntax
from backends.chat_template import ChatTemplateError, model_chat_template, template_takes_tools
from backends.engine import Engine, GenerationRequest
from backends.output_constraints import ConstraintSpec, JsonOutput, ToolCallOutput
from backends.sampling import SamplingParams
from backends.tool_calls import ToolCallParser

logger = logging.getLogger("draftpen.server")

# A chat answer's shape: ChatFormat, or another dialect's subclass taking its arguments.
ChatFormatFactory = type[ChatFormat]

T = TypeVar("T")

MAX_BODY_BYTES = 1 << 20
# An oversize body is read and thrown away up to this size, so the client gets its 413
# instead of a broken pipe; beyond it the connection is simply closed.
_DRAIN_LIMIT_BYTES = 32 << 20
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
        scheduler: PairScheduler,
        queue: GenerationQueue,
        *,
        pairs: PairDirectory,
        settings: Settings,
        max_body_bytes: int = MAX_BODY_BYTES,
        idle_exit: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.queue = queue
        self.pairs = pairs
        self.settings = settings
        self.max_body_bytes = max_body_bytes
        self.idle_exit = idle_exit
        self.created = int(time.time())
        self.version = engine_version()
        self.responses = JobResponses(queue, scheduler)
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
        held = self.scheduler.snapshot()
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
            ),
            attached_clients=self.attached,
            keep_alive_seconds=self.scheduler.keep_alive,
            idle_exit=self.idle_exit,
            tcp=self.tcp_url,
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

        def prepare(engine: Engine) -> Prepared:
            plan = self._reply_plan(parsed, engine)
            prompt, prompt_text, left_out = self._chat_prompt(parsed, engine, plan, options)
            formatter = make_format(
                parsed.model,
                include_usage=parsed.include_usage,
                tool_parser=plan.tool_parser,
                token_bytes=self._token_bytes(parsed, engine),
                reasoning=engine.reasoning_format(prompt_text),
                provenance=options.provenance,
                response_id=response_id,
                left_out_messages=left_out,
            )
            generation = self._generation_request(
                parsed, prompt, "messages", plan.constraint, engine
            )
            return Prepared(generation, formatter)

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
        options = DraftpenRequestOptions()

        def count(engine: Engine) -> int:
            plan = self._reply_plan(parsed, engine)
            return len(self._chat_prompt(parsed, engine, plan, options)[0])

        job = EngineJob(
            id=new_response_id("count"),
            pair=parsed.model,
            kind="token count",
            loop=asyncio.get_running_loop(),
            inspect=count,
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

        def prepare(engine: Engine) -> Prepared:
            prompt = engine.text_prompt(parsed.prompt)
            formatter = CompletionFormat(
                parsed.model,
                include_usage=parsed.include_usage,
                token_bytes=self._token_bytes(parsed, engine),
                provenance=options.provenance,
                response_id=response_id,
            )
            generation = self._generation_request(parsed, prompt, "prompt", None, engine)
            return Prepared(generation, formatter)

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
                '{"pair": NAME, "context_length": N, "exact": true|false} (the last two '
                "optional).",
                param=param,
                code="invalid_value",
            ) from None
        await asyncio.to_thread(self.pairs.check, wanted.pair)
        options = None
        if wanted.context_length is not None or wanted.exact is not None:
            base = self.scheduler.options_for(wanted.pair)
            options = LoadOptions(
                context_length=_given(wanted.context_length, base.context_length),
                exact=_given(wanted.exact, base.exact),
            )
        job = EngineJob(
            id=new_response_id("load"),
            pair=wanted.pair,
            kind="load",
            loop=asyncio.get_running_loop(),
            load_options=options,
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

    def _token_bytes(
        self, parsed: GenerationFields, engine: Engine
    ) -> Callable[[int], bytes] | None:
        """How the response writes a token's text, when the request asked for logprobs."""
        return engine.target.token_bytes if parsed.requested_logprobs is not None else None

    def _reply_plan(self, parsed: ChatCompletionRequest, engine: Engine) -> _ReplyPlan:
        """What the prompt shows of the tools, how the reply is read, what it must be."""
        text = _json_output(parsed.response_format)
        tools = parsed.tool_specs
        choice = parsed.tool_choice
        if not tools or choice == "none":
            # "none": the model is not shown the tools, so it answers in text.
            return _ReplyPlan((), None, ConstraintSpec(text=text) if text else None)
        template = model_chat_template(engine.target)
        if not template_takes_tools(template):
            raise ApiError(
                400,
                f"The chat template of '{parsed.model}' does not show tools to the model, so "
                "it cannot call them. Leave tools out (or send tool_choice 'none'), or use "
                "a pair whose template takes tools, such as starter.",
                param="tools",
                code="invalid_value",
            )
        syntax = tool_call_syntax(template)
        if syntax is None:
            raise ApiError(
                400,
                f"The chat template of '{parsed.model}' teaches a tool-call syntax draftpen "
                "does not read yet (it reads Hermes/Qwen <tool_call> blocks and Llama 3.1 JSON "
                "calls). Leave tools out or send tool_choice 'none', or use another pair.",
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

    def _chat_prompt(
        self,
        parsed: ChatCompletionRequest,
        engine: Engine,
        plan: _ReplyPlan,
        options: DraftpenRequestOptions,
    ) -> tuple[list[int], str, int]:
        """The prompt's tokens and text, and how many old messages fitting left out."""
        thinking = _given(parsed.thinking, self.settings.thinking)
        messages = parsed.chat_messages()
        try:
            if options.fit_context and not plan.prompt_tools:
                reply_room = parsed.completion_limit[0] or self.settings.max_tokens
                fitted = fit_conversation(engine, messages, reply_room, thinking=thinking)
                return list(fitted.tokens), fitted.text, fitted.dropped_messages
            prompt_text = engine.chat_prompt_text(messages, plan.prompt_tools, thinking=thinking)
            return engine.text_prompt(prompt_text), prompt_text, 0
        except ChatTemplateError as error:
            raise ApiError(
                400,
                f"{error} Over the API, POST /v1/completions sends raw text instead.",
                param="messages",
                code="invalid_value",
            ) from None

    async def read_json(self, request: Request) -> object:
        """The parsed JSON body of ``request``; its size is checked as it arrives."""
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
        engine: Engine,
    ) -> GenerationRequest:
        n_ctx = engine.target.n_ctx
        bigger = (
            "or load the pair with a larger context (POST /draftpen/load with "
            f'{{"pair": "{parsed.model}", "context_length": N}}, or draftpen serve --context N)'
        )
        if len(prompt) >= n_ctx:
            raise ApiError(
                400,
                f"The prompt is {len(prompt)} tokens but this model's context holds {n_ctx}. "
                f"Shorten it, {bigger}.",
                param=prompt_param,
                code="context_length_exceeded",
            )
        room = n_ctx - len(prompt)
        limit, _ = parsed.completion_limit
        if limit is not None and limit > room:
            # A ceiling, as llama.cpp's server and Ollama read it: agents send limits
            # far above what is left (opencode: max_tokens 32000 after a 7k prompt) and
            # expect the reply to stop at the context's end, finishing with "length".
            limit = room
        settings = self.settings
        speculative = parsed.speculative
        drafter = (speculative.drafter if speculative else None) or settings.drafter
        draft_tokens = speculative.k if speculative and speculative.k is not None else None
        if drafter == "model" and engine.draft is None:
            raise ApiError(
                400,
                f"'{parsed.model}' has no draft model, so speculative.drafter 'model' "
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
                presence_penalty=parsed.presence_penalty or 0.0,
                frequency_penalty=parsed.frequency_penalty or 0.0,
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
