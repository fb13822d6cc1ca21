"""The wire format of draftpen's OpenAI-compatible API: requests in, errors out.

Requests are validated strictly with pydantic: wrong types are not coerced ("5" is not
an integer), unknown fields are refused by name, and every failure becomes one
OpenAI-style error object, ``{"error": {"message", "type", "param", "code"}}``, whose
message says what is wrong and what is accepted. JSON Schemas (tool parameters,
``response_format``) are checked against their meta-schema with ``jsonschema``.

Fields that change nothing for a local model (``user``, ``metadata``, ``store``, ...)
are accepted and ignored. Fields the decoding loop does not honour yet would be
parsed and range-checked like the others, and refused at anything but their neutral
value by :data:`NOT_YET_HONOURED` (empty today: the penalties it held are applied).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, ClassVar, Literal, TypeVar

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.client.wire import DraftpenRequestOptions
from backends.engine import DRAFTER_CHOICES

MAX_STOP_STRINGS = 16
MAX_DRAFT_TOKENS = 32
# Chat choices per request (``n``): each is a whole generation, run one after another.
MAX_CHOICES = 16
# OpenAI's rule for function and schema names.
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

# Fields the decoding loop does not honour yet, and what to send instead. They are typed
# and range-checked in the request models like every other field; a value other than
# their neutral one (absent, false, 0) gets a 400 naming the field.
NOT_YET_HONOURED: dict[str, str] = {}


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

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole: an error found in the runtime process crosses to the front.
        fields = (self.error_type, self.param, self.code, self.headers)
        return (_api_error, (self.status, self.message, *fields))

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


def _api_error(
    status: int,
    message: str,
    error_type: str,
    param: str | None,
    code: str | None,
    headers: dict[str, str],
) -> ApiError:
    """An :class:`ApiError` rebuilt from its pickle."""
    return ApiError(status, message, error_type=error_type, param=param, code=code, headers=headers)


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def text_of(value: object, what: str) -> object:
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


def _checked_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` if it is a well-formed JSON Schema (by its meta-schema), else ValueError."""
    validator = jsonschema.validators.validator_for(
        schema, default=jsonschema.validators.Draft202012Validator
    )
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as error:
        where = "/".join(str(part) for part in error.absolute_path)
        at = f" at '{where}'" if where else ""
        raise ValueError(f"is not a valid JSON Schema: {error.message}{at}") from None
    return schema


class FunctionDefinition(Strict):
    """A function the model may call: OpenAI's ``tools[].function``."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _parameters_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return value
        if value.get("type", "object") != "object":
            raise ValueError(
                'must be a JSON Schema of "type": "object" (arguments are named), '
                f"not {value.get('type')!r}"
            )
        return _checked_json_schema(value)


class JsonSchemaFormat(Strict):
    """``response_format.json_schema``: a schema the reply must match.

    OpenAI requires its ``name``; llama.cpp's server, vLLM and Ollama do not, and
    clients written for them leave it out, so it is optional here.
    """

    name: str | None = Field(None, pattern=NAME_PATTERN)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _well_formed(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return value if value is None else _checked_json_schema(value)


class Prediction(Strict):
    """OpenAI's Predicted Outputs: text the answer will probably repeat."""

    type: Literal["content"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _content_parts(cls, value: object) -> object:
        return text_of(value, "prediction content")


class Speculative(Strict):
    """draftpen's extension: steer or turn off speculation for one request."""

    drafter: (
        Literal["auto", "model", "mtp", "eagle3", "dflash", "dspark", "ngram", "none"] | None
    ) = Field(None, description=f"one of {', '.join(DRAFTER_CHOICES)}")
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


class GenerationFields(Strict):
    """Fields shared by chat and text completions."""

    # The most choices (``n``) a request of this kind may ask for.
    max_choices: ClassVar[int] = 1

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
    # draftpen's own clients: provenance, progress notices, fitting the context.
    draftpen: DraftpenRequestOptions | None = None
    # How many choices (chat completions: up to MAX_CHOICES; completions: 1).
    n: int | None = None
    # Accepted at its neutral value only, because common clients always send it.
    logit_bias: dict[str, float] | None = None
    # OpenAI's penalties on tokens already in the reply, applied to p and q alike.
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    # Change nothing for a local model; accepted and ignored.
    user: str | None = None

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
    def _choices(cls, value: int | None) -> int | None:
        if value is None or value == 1:
            return value
        if cls.max_choices == 1:
            raise ValueError(
                "must be 1: text completions write one choice per request (chat "
                f"completions take n up to {MAX_CHOICES})"
            )
        if not 1 <= value <= cls.max_choices:
            raise ValueError(
                f"must be 1 to {cls.max_choices}: each choice is a whole generation, "
                "run one after another"
            )
        return value

    @property
    def choices(self) -> int:
        """How many choices to write (``n``, 1 when left out)."""
        return self.n or 1

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("token biases are not supported; leave logit_bias out or send {}")
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

    @property
    def requested_logprobs(self) -> int | None:
        """How many alternatives per token to report (None: no logprobs at all)."""
        return None

    def check(self) -> None:
        """Rules across fields, after the types: raises :class:`ApiError` naming the field."""
        for name, advice in NOT_YET_HONOURED.items():
            value = getattr(self, name, None)
            if value not in (None, False, 0):
                raise ApiError(
                    400,
                    f"'{name}' is not supported yet: {advice}.",
                    param=name,
                    code="unsupported_parameter",
                )


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
        parsed = model.model_validate(data)
    except ValidationError as error:
        raise validation_error(error, accepted=model.model_fields) from None
    parsed.check()
    return parsed


def invalid(param: str, message: str) -> ApiError:
    """The 400 for a value of ``param`` that is wrong, saying why."""
    return ApiError(
        400, f"Invalid value for '{param}': {message}.", param=param, code="invalid_value"
    )


# pydantic names union members and wrappers in an error's location; they are not
# parameter names and are dropped from ``param``.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "tuple", "none"}


def _param_name(location: tuple[int | str, ...], prefix: str = "") -> str | None:
    name = prefix
    for item in location:
        if isinstance(item, int):
            name += f"[{item}]"
        elif "[" in item or item in _TYPE_TAGS:
            continue
        else:
            name += f".{item}" if name else item
    return name or None


def validation_error(
    error: ValidationError,
    *,
    prefix: str = "",
    accepted: Collection[str] = (),
    noun: str = "parameter",
) -> ApiError:
    """pydantic's first complaint about a request as the 400 a client reads, for every
    dialect: the parameter named as the client sent it (``messages[0].role``, under
    ``prefix`` for a part validated alone), ``accepted`` listed for an unknown top-level
    one, and ``noun`` as the dialect calls its fields."""
    first = error.errors(include_url=False)[0]
    kind = first["type"]
    param = _param_name(tuple(first["loc"]), prefix)
    message = str(first["msg"]).removeprefix("Value error, ")
    shown = first.get("input")
    got = f" (got {shown!r})" if isinstance(shown, str | int | float | bool) else ""
    if kind == "extra_forbidden":
        listed = ", ".join(sorted(accepted)) if param and "." not in param else ""
        hint = f" Accepted {noun}s: {listed}." if listed else ""
        return ApiError(
            400, f"Unknown {noun} '{param}'.{hint}", param=param, code="unknown_parameter"
        )
    if kind == "missing":
        return ApiError(
            400,
            f"Missing required {noun} '{param}'.",
            param=param,
            code="missing_required_parameter",
        )
    if param is None:  # a rule across fields, such as stream_options without stream
        return ApiError(400, f"Invalid request: {message}{got}.", code="invalid_value")
    code = "invalid_type" if kind.endswith("_type") else "invalid_value"
    return ApiError(400, f"Invalid value for '{param}': {message}{got}.", param=param, code=code)
