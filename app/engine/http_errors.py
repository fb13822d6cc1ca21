"""Errors as OpenAI-style JSON: from the engine, from routing, and unexpected ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.engine.dialects.anthropic_messages import anthropic_error_body
from app.engine.schema import (
    ApiError,
)
from app.errors import DraftpenError
from backends.errors import BackendError, ContextOverflowError
from backends.output.constraints import GrammarError


def generation_error(error: BaseException) -> ApiError:
    """The API error for an exception raised by the engine while loading or generating."""
    if isinstance(error, ApiError):
        return error  # found while preparing the request against the loaded pair
    if isinstance(error, ContextOverflowError):
        return ApiError(400, str(error), code="context_length_exceeded")
    if isinstance(error, GrammarError):
        # A schema that passed the JSON Schema meta-schema but that llguidance cannot
        # compile (an unsupported keyword, say): the request is at fault, not the server.
        return ApiError(
            400,
            f"{error} Simplify the schema, or send response_format text and describe the "
            "format in the prompt.",
            code="invalid_schema",
        )
    if isinstance(error, BackendError):
        return ApiError(500, str(error), error_type="server_error", code="generation_failed")
    if isinstance(error, DraftpenError):
        # Loading the pair failed (a file gone or broken since the request was checked).
        return ApiError(500, str(error), error_type="server_error", code="model_load_failed")
    return ApiError(
        500,
        f"Generation failed: {error!r}. The server log has the details.",
        error_type="server_error",
        code="internal_error",
    )


ErrorShape = Callable[[ApiError], dict[str, Any]]

# The error body each dialect's clients read, by the path prefix of its routes; OpenAI's
# shape (ApiError.body) everywhere else.
_ERROR_SHAPES: list[tuple[str, ErrorShape]] = [
    ("/v1/messages", anthropic_error_body),
]


def error_body(path: str, error: ApiError) -> dict[str, Any]:
    """``error`` as the body the dialect served at ``path`` reports errors in."""
    for prefix, shape in _ERROR_SHAPES:
        if path == prefix or path.startswith(prefix + "/"):
            return shape(error)
    return error.body()


def error_json(request: Request, error: ApiError) -> JSONResponse:
    """The JSON response for ``error`` in the shape of the dialect ``request`` speaks."""
    return JSONResponse(
        error_body(request.url.path, error), status_code=error.status, headers=error.headers
    )


async def api_error_response(request: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return error_json(request, error)


async def http_error_response(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        message = (
            f"There is no {request.url.path} here. draftpen serves GET /v1/models, "
            "POST /v1/chat/completions, POST /v1/completions, POST /v1/messages (and "
            "/v1/messages/count_tokens), POST /v1/responses (and GET and DELETE "
            "/v1/responses/{id}), GET /health, and for its own "
            "clients POST /draftpen/load and GET /draftpen/attach."
        )
    elif error.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}."
    else:
        message = str(error.detail)
    api_error = ApiError(error.status_code, message, code="unknown_url", headers=error.headers)
    return error_json(request, api_error)


async def internal_error_response(request: Request, error: Exception) -> Response:
    return error_json(request, generation_error(error))
