"""The wire format of draftpen's OpenAI-compatible API: requests in, errors out.

Requests are validated strictly with pydantic: wrong types are not coerced ("5" is not
an integer), unknown fields are refused by name, and every failure becomes one
OpenAI-style error object, ``{"error": {"message", "type", "param", "code"}}``, whose
message says what is wrong and what is accepted. A few OpenAI fields draftpen cannot
honour are accepted only at their neutral values (``n: 1``, penalties of 0, no
logprobs), so clients that always send them keep working.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from backends.engine import DRAFTER_CHOICES

MAX_STOP_STRINGS = 16
MAX_DRAFT_TOKENS = 32


class ApiError(Exception):
    """An error answered as ``{"error": {...}}`` with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body, in OpenAI's shape."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def _text_of(value: object, what: str) -> object:
    """A string, or OpenAI's list of text parts joined; anything else is left to fail."""
    if isinstance(value, list):
        texts: list[str] = []
        for part in value:
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
                and set(part) <= {"type", "text"}
            ):
                raise ValueError(
                    "must be a string or a list of {'type': 'text', 'text': ...} parts "
                    f"(draftpen serves text models: no images or audio in {what})"
                )
            texts.append(part["text"])
        return "".join(texts)
    return value


class Message(_Strict):
    """One chat message; ``developer`` is treated as ``system``."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content_parts(cls, value: object) -> object:
        return _text_of(value, "content")


class Prediction(_Strict):
    """OpenAI's Predicted Outputs: text the answer will probably repeat."""

    type: Literal["content"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _content_parts(cls, value: object) -> object:
        return _text_of(value, "prediction content")


class Speculative(_Strict):
    """draftpen's extension: steer or turn off speculation for one request."""

    drafter: Literal["auto", "model", "ngram", "none"] | None = Field(
        None, description=f"one of {', '.join(DRAFTER_CHOICES)}"
    )
    k: int | None = Field(None, ge=0, le=MAX_DRAFT_TOKENS, description="draft tokens per round")
    exact: bool | None = Field(
        None,
        description="auto verifies only in batches that round exactly like plain decoding "
        "(bit-identical only where the server loaded exact kernels: exact_output = true)",
    )


class StreamOptions(BaseModel):
    """Options of a streamed response (fields OpenAI adds later are ignored)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    include_usage: bool = False


class GenerationFields(_Strict):
    """Fields shared by chat and text completions."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, lt=1)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    prediction: Prediction | None = None
    speculative: Speculative | None = None
    # Accepted at their neutral values only, because common clients always send them.
    n: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: object) -> object:
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            if len(value) > MAX_STOP_STRINGS:
                raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
            return tuple(value)
        raise ValueError("must be a string or a list of strings")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("must be 1: draftpen writes one choice per request")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value not in (None, 0, 0.0):
            raise ValueError("penalties are not supported; leave it out or send 0")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> GenerationFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def completion_limit(self) -> tuple[int | None, str]:
        """The requested output limit and the field it came from."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(GenerationFields):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    logprobs: bool | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("logprobs are not supported; leave it out or send false")
        return value


class CompletionRequest(GenerationFields):
    """``POST /v1/completions``: raw prompt text, no chat template."""

    prompt: str
    logprobs: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: object) -> object:
        if isinstance(value, list):
            if len(value) == 1 and isinstance(value[0], str):
                return value[0]
            raise ValueError("must be a string (or a list holding exactly one string)")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("logprobs are not supported; leave it out or send null")
        return value


RequestT = TypeVar("RequestT", bound=GenerationFields)


def parse_request(model: type[RequestT], data: object) -> RequestT:
    """Validate parsed JSON into ``model``; raises :class:`ApiError` (400) saying why."""
    if not isinstance(data, dict):
        raise ApiError(
            400,
            f"The request body must be a JSON object, not {type(data).__name__}.",
            code="invalid_type",
        )
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise _api_error(model, error) from None


# pydantic names union members and wrappers in an error's location; they are not
# parameter names and are dropped from ``param``.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "tuple", "none"}


def _param_name(location: tuple[int | str, ...]) -> str | None:
    name = ""
    for item in location:
        if isinstance(item, int):
            name += f"[{item}]"
        elif "[" in item or item in _TYPE_TAGS:
            continue
        else:
            name += f".{item}" if name else item
    return name or None


def _api_error(model: type[GenerationFields], error: ValidationError) -> ApiError:
    first = error.errors(include_url=False)[0]
    kind = first["type"]
    param = _param_name(tuple(first["loc"]))
    message = str(first["msg"]).removeprefix("Value error, ")
    shown = first.get("input")
    got = f" (got {shown!r})" if isinstance(shown, str | int | float | bool) else ""
    if kind == "extra_forbidden":
        accepted = ", ".join(sorted(model.model_fields)) if param and "." not in param else ""
        hint = f" Accepted parameters: {accepted}." if accepted else ""
        return ApiError(
            400, f"Unknown parameter '{param}'.{hint}", param=param, code="unknown_parameter"
        )
    if kind == "missing":
        return ApiError(
            400,
            f"Missing required parameter '{param}'.",
            param=param,
            code="missing_required_parameter",
        )
    if param is None:  # a rule across fields, such as stream_options without stream
        return ApiError(400, f"Invalid request: {message}.", code="invalid_value")
    code = "invalid_type" if kind.endswith("_type") else "invalid_value"
    return ApiError(400, f"Invalid value for '{param}': {message}{got}.", param=param, code=code)
