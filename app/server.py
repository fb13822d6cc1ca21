"""OpenAI-compatible HTTP over a Unix socket, for local agents.

A small Starlette app served by uvicorn on a socket this module binds itself:
``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed as
server-sent events or not) and ``GET /health``. No TCP port is opened unless asked for.

Data flow: a handler validates the request (``server_schema``), renders and tokenizes
the prompt, and submits a :class:`~backends.engine.GenerationRequest` to the
:class:`~app.server_queue.GenerationQueue`, whose one worker thread runs the engine's
speculative loop. Events come back through an asyncio queue and are written out as
OpenAI chunks, each carrying the running speculative statistics in a ``draftpen``
field. A client that disconnects cancels its generation at the loop's next round.

The socket itself (path, modes, peer uid check, stale sockets) is ``server_socket``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import uvicorn
import uvicorn.config
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.server_queue import (
    DEFAULT_QUEUE_LIMIT,
    GenerationJob,
    GenerationQueue,
    QueueFullError,
    ShuttingDownError,
)
from app.server_schema import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationFields,
    parse_request,
)
from app.server_socket import (
    bind_tcp_socket,
    bind_unix_socket,
    peer_checked_protocol,
    remove_socket_if_ours,
)
from app.settings import Settings
from backends.base import ChatMessage
from backends.chat_template import ChatTemplateError
from backends.engine import Engine, GenerationRequest
from backends.errors import BackendError, ContextOverflowError
from backends.sampling import SamplingParams
from backends.speculative import GenerationEvent

logger = logging.getLogger("draftpen.server")

T = TypeVar("T")

MAX_BODY_BYTES = 1 << 20
# An oversize body is read and thrown away up to this size, so the client gets its 413
# instead of a broken pipe; beyond it the connection is simply closed.
_DRAIN_LIMIT_BYTES = 32 << 20
RETRY_AFTER_SECONDS = 2
# How long shutdown waits for the generation in progress to reach its next round.
_WORKER_STOP_SECONDS = 30.0


# -- the HTTP API ----------------------------------------------------------------


class _Tally:
    """What a generation has produced so far, read by the response formats."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.last: GenerationEvent | None = None
        self.decision = ""
        self.prediction_drafted = 0
        self.prediction_accepted = 0
        self._drafted = 0
        self._accepted = 0

    def add(self, event: GenerationEvent) -> None:
        """Count one event; draft work is attributed to the drafter of its round."""
        drafted = event.stats.drafted - self._drafted
        accepted = event.stats.accepted - self._accepted
        self._drafted, self._accepted = event.stats.drafted, event.stats.accepted
        if event.drafter == "prediction":
            self.prediction_drafted += drafted
            self.prediction_accepted += accepted
        self.pieces.append(event.text)
        self.last = event
        self.decision = event.decision or self.decision

    @property
    def text(self) -> str:
        """The whole answer so far."""
        return "".join(self.pieces)

    @property
    def finish_reason(self) -> str | None:
        """The finish reason ("stop", "length", "cancelled") once the generation ended."""
        return self.last.finish_reason if self.last else None

    def draftpen(self) -> dict[str, Any]:
        """The ``draftpen`` field: running statistics plus the latest drafter choice."""
        if self.last is None:
            return {}
        return {
            **self.last.stats.as_dict(),
            "drafter": self.last.drafter,
            "draft_length": self.last.draft_length,
            "estimated_speedup": round(self.last.estimated_speedup, 3),
            "decision": self.decision,
        }

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage block; prediction tokens count as OpenAI counts them."""
        stats = self.last.stats if self.last else None
        prompt = stats.prompt_tokens if stats else 0
        completion = stats.generated_tokens if stats else 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens if stats else 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "accepted_prediction_tokens": self.prediction_accepted,
                "rejected_prediction_tokens": self.prediction_drafted - self.prediction_accepted,
            },
        }


class _Format:
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

    def _chunk(self, choice: dict[str, Any], tally: _Tally) -> dict[str, Any]:
        chunk = {**self._envelope(self.chunk_object), "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI: only the last chunk carries usage
        chunk["draftpen"] = tally.draftpen()
        return chunk

    def stream_chunks(self, event: GenerationEvent, tally: _Tally) -> list[dict[str, Any]]:
        """The chunks for one event: its text (if any), then the finish (if it is the last)."""
        chunks = []
        if event.text or self._first_chunk:
            chunks.append(self._chunk(self._text_choice(event.text, self._first_chunk), tally))
            self._first_chunk = False
        if event.finish_reason is not None:
            chunks.append(self._chunk(self._finish_choice(event.finish_reason), tally))
        return chunks

    def usage_chunk(self, tally: _Tally) -> dict[str, Any]:
        """The last chunk when ``stream_options.include_usage`` is set: no choices, usage."""
        return {
            **self._envelope(self.chunk_object),
            "choices": [],
            "usage": tally.usage(),
            "draftpen": tally.draftpen(),
        }

    def response(self, tally: _Tally) -> dict[str, Any]:
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


class _ChatFormat(_Format):
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


class _CompletionFormat(_Format):
    id_prefix = "cmpl"
    response_object = "text_completion"
    chunk_object = "text_completion"

    def _text_choice(self, text: str, first: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": None}

    def _finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}

    def _whole_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def _sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


def _generation_error(error: Exception) -> ApiError:
    """The API error for an exception raised by the engine while generating."""
    if isinstance(error, ContextOverflowError):
        return ApiError(400, str(error), code="context_length_exceeded")
    if isinstance(error, BackendError):
        return ApiError(500, str(error), error_type="server_error", code="generation_failed")
    return ApiError(
        500,
        f"Generation failed: {error!r}. The server log has the details.",
        error_type="server_error",
        code="internal_error",
    )


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
                ApiError: _api_error_response,
                HTTPException: _http_error_response,
                Exception: _internal_error_response,
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
        messages = [
            ChatMessage("system" if message.role == "developer" else message.role, message.content)
            for message in parsed.messages
        ]
        try:
            # Tokenizing only reads the vocabulary, which llama.cpp allows while another
            # thread decodes (llama-server does the same); it runs off the event loop.
            prompt = await asyncio.to_thread(self.engine.chat_prompt, messages)
        except ChatTemplateError as error:
            raise ApiError(
                400,
                f"{error} Over the API, POST /v1/completions sends raw text instead.",
                param="messages",
                code="invalid_value",
            ) from None
        formatter = _ChatFormat(self.model_id, include_usage=parsed.include_usage)
        return await self._respond(request, parsed, prompt, formatter, prompt_param="messages")

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``: raw text in, no chat template."""
        parsed = parse_request(CompletionRequest, await self._read_json(request))
        self._check_model(parsed.model)
        if not parsed.prompt:
            raise ApiError(400, "The prompt is empty.", param="prompt", code="invalid_value")
        prompt = await asyncio.to_thread(self.engine.text_prompt, parsed.prompt)
        formatter = _CompletionFormat(self.model_id, include_usage=parsed.include_usage)
        return await self._respond(request, parsed, prompt, formatter, prompt_param="prompt")

    # -- the parts -------------------------------------------------------------

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "draftpen",
        }

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
        self, parsed: GenerationFields, prompt: list[int], prompt_param: str
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
            )
        except ValueError as error:
            raise ApiError(400, str(error), code="invalid_value") from None

    async def _respond(
        self,
        request: Request,
        parsed: GenerationFields,
        prompt: list[int],
        formatter: _Format,
        *,
        prompt_param: str,
    ) -> Response:
        generation = self._generation_request(parsed, prompt, prompt_param)
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

    async def _stream(self, job: GenerationJob, formatter: _Format) -> AsyncIterator[str]:
        """Server-sent events for a job, in OpenAI's chunk format, then ``[DONE]``."""
        tally = _Tally()
        try:
            async for event in job.events():
                tally.add(event)
                for chunk in formatter.stream_chunks(event, tally):
                    yield _sse(chunk)
        except Exception as error:
            # The status line is long gone: OpenAI reports such errors as an event.
            yield _sse(_generation_error(error).body())
            return
        if formatter.include_usage:
            yield _sse(formatter.usage_chunk(tally))
        yield _sse("[DONE]")

    async def _collect(self, request: Request, job: GenerationJob, formatter: _Format) -> Response:
        """The whole answer of a job, cancelling it if the client goes away meanwhile."""
        tally = _Tally()
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
            raise _generation_error(failure)
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


def _size_text(size: int) -> str:
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    return f"{size} bytes"


def _given(value: T | None, default: T) -> T:
    return default if value is None else value


async def _api_error_response(request: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _http_error_response(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        message = (
            f"There is no {request.url.path} here. draftpen serves GET /v1/models, "
            "POST /v1/chat/completions, POST /v1/completions and GET /health."
        )
    elif error.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}."
    else:
        message = str(error.detail)
    api_error = ApiError(error.status_code, message, code="unknown_url")
    return JSONResponse(api_error.body(), status_code=error.status_code, headers=error.headers)


async def _internal_error_response(request: Request, error: Exception) -> Response:
    api_error = _generation_error(error)
    return JSONResponse(api_error.body(), status_code=api_error.status)


# -- running it ----------------------------------------------------------------------


def _log_config() -> dict[str, Any]:
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    # stdout carries only the "listening on" line that scripts wait for; logs go to stderr.
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    config["loggers"]["draftpen"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


class _UvicornServer(uvicorn.Server):
    """uvicorn's server, stopping the generations before it waits for open responses."""

    def __init__(
        self, config: uvicorn.Config, queue: GenerationQueue, stop: threading.Event
    ) -> None:
        super().__init__(config)
        self._queue = queue
        self._stop = stop

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        # A SIGTERM that came before uvicorn installed its own handlers.
        if self._stop.is_set():
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn waits for every open response to finish; cancelling the generations
        # makes streams end at the next round (finish_reason "cancelled").
        self._queue.shutdown()
        await super().shutdown(sockets=sockets)


class AgentServer:
    """One engine served on a Unix socket (and on TCP only when ``tcp`` is given).

    :meth:`run` blocks until the server is stopped (SIGTERM/SIGINT, or :meth:`stop`
    from another thread), then cancels what is in flight and removes its socket. The
    caller keeps ownership of the engine. ``allowed_uid`` is the one user served over
    the Unix socket (default: this process's); ``stop``, when already set at startup
    (a SIGTERM during model loading), makes the server stop at once.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        model_id: str,
        socket_path: Path,
        settings: Settings,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
        tcp: tuple[str, int] | None = None,
        allowed_uid: int | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        stop: threading.Event | None = None,
        configure_logging: bool = True,
    ) -> None:
        self.engine = engine
        self.socket_path = socket_path
        self.tcp = tcp
        self.queue = GenerationQueue(engine, max_waiting=queue_limit)
        self.api = AgentApi(
            engine,
            self.queue,
            model_id=model_id,
            settings=settings,
            max_body_bytes=max_body_bytes,
        )
        self._stop = stop or threading.Event()
        uid = os.getuid() if allowed_uid is None else allowed_uid
        config = uvicorn.Config(
            self.api.app(),
            http=peer_checked_protocol(uid),
            ws="none",
            lifespan="off",
            # uvicorn's console logging, plus draftpen's own lines; an embedding
            # program (a test) keeps its own logging instead.
            log_config=_log_config() if configure_logging else None,
            timeout_graceful_shutdown=int(_WORKER_STOP_SECONDS),
        )
        self._server = _UvicornServer(config, self.queue, self._stop)
        self.worker_stopped = True

    def run(self, announce: Callable[[str], None] | None = None) -> None:
        """Listen, serve until stopped, then clean up; ``announce`` gets each address."""
        listener = bind_unix_socket(self.socket_path)
        info = self.socket_path.stat()
        identity = (info.st_dev, info.st_ino)
        sockets = [listener]
        self.queue.start()
        self.worker_stopped = False
        try:
            if self.tcp is not None:
                sockets.append(bind_tcp_socket(*self.tcp))
            if announce is not None:
                announce(f"unix:{self.socket_path}")
                if self.tcp is not None:
                    announce(f"http://{self.tcp[0]}:{self.tcp[1]}")
            self._server.run(sockets=sockets)
        finally:
            self.queue.shutdown()
            self.worker_stopped = self.queue.join(_WORKER_STOP_SECONDS)
            if not self.worker_stopped:
                logger.warning("a generation did not stop in %.0fs", _WORKER_STOP_SECONDS)
            for sock in sockets:
                sock.close()
            remove_socket_if_ours(self.socket_path, identity)

    def stop(self) -> None:
        """Ask a running server to stop (thread-safe: uvicorn polls the flag)."""
        self._stop.set()
        self._server.should_exit = True
