"""Anthropic Messages requests: their shapes, validated (see anthropic_translation).

A ``POST /v1/messages`` body is validated here, strictly in the types of the fields
draftpen knows and leniently about fields it does not (Anthropic adds fields often and
Claude Code sends many: ``metadata``, ``context_management``, ``service_tier``...; they
are ignored), then rewritten as the engine's one internal request, a validated
:class:`~app.engine.dialects.openai_chat_schema.ChatCompletionRequest`:

- ``system`` (a string or text blocks) becomes the first, system, message;
- ``text`` blocks become message content; an assistant's ``tool_use`` blocks become its
  ``tool_calls``; a user's ``tool_result`` blocks become ``tool`` messages (an error
  result's text starts with "Error: ", since chat templates have no error flag);
  ``thinking`` blocks of earlier turns are not shown to the model (as
  ``reasoning_content`` is not);
- ``image``, ``document`` and other blocks a text model cannot read get a 400 naming
  the block;
- ``tools`` keep their ``input_schema`` as the function's parameters; tools of
  Anthropic's own server-side types (``web_search_...``, ``code_execution_...``) are
  left out unless ``tool_choice`` names one; ``tool_choice`` ``any`` is ``required``
  and ``tool`` names the function, so both are grammar-certain;
- ``thinking`` ``enabled``/``adaptive``/``disabled`` turns the template's thinking switch;
- ``output_config.format`` (structured outputs) is the chat request's JSON-schema
  ``response_format``, followed exactly;
- ``stop_sequences``, ``temperature``, ``top_p``, ``top_k`` and ``max_tokens`` go
  through as they are; ``cache_control`` is accepted anywhere and ignored (the engine
  keeps conversations' prefixes anyway);
- ``speculative`` (draftpen's own, as in the other dialects) steers or turns off
  speculation for the request.

Errors the chat request's own checks find name the Anthropic field they came from.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.engine.schema import MAX_STOP_STRINGS, ApiError, Speculative, validation_error

# Anthropic's rule for tool names.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
# Block types a text model cannot read; named in the 400 they get.
UNREADABLE_BLOCKS = {
    "image": "images",
    "document": "documents",
    "search_result": "search results",
    "container_upload": "files",
}


class Lenient(BaseModel):
    """Known fields typed strictly; unknown ones (Anthropic adds them often) ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class TextBlock(Lenient):
    """A ``text`` block (``cache_control`` and ``citations`` ignored)."""

    type: Literal["text"]
    text: str


class ToolUseBlock(Lenient):
    """A tool call an earlier assistant turn made."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(Lenient):
    """The answer to one ``tool_use``: a string, or text blocks."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class ThinkingBlock(Lenient):
    """An earlier turn's reasoning, sent back as the API returned it; not shown again."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Lenient):
    """Reasoning Anthropic's API encrypted; nothing a local model can read."""

    type: Literal["redacted_thinking"]
    data: str


BLOCKS: dict[str, type[Lenient]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
}
# Which role may send which block.
ROLE_BLOCKS = {
    "system": {"text"},
    "user": {"text", "tool_result"},
    "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
}


class MessageIn(Lenient):
    """One turn: ``content`` a string or a list of blocks (read by :func:`chat_request`).

    ``system`` turns among the messages (Claude Code sends them, with the
    ``mid-conversation-system`` beta) are system messages where they stand.
    """

    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class ToolIn(Lenient):
    """A tool: a function with an ``input_schema``, or one of Anthropic's server tools."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    # Follow input_schema exactly (its keywords all enforced) rather than as a guide.
    strict: bool | None = None
    # Absent or "custom": a function of the client's. Anything else ("web_search_20250305",
    # "bash_20250124", ...) is a tool Anthropic defines and runs; a local model has none.
    type: str | None = None

    @property
    def is_function(self) -> bool:
        """Whether this is the client's own function (the only kind a local model calls)."""
        return self.type in (None, "custom")

    @model_validator(mode="after")
    def _function_has_schema(self) -> ToolIn:
        if self.is_function and self.input_schema is None:
            raise ValueError(f"tool {self.name!r} needs an input_schema (a JSON Schema object)")
        return self


class ToolChoiceIn(Lenient):
    """``auto``, ``any`` (some tool), ``tool`` (the one named) or ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoiceIn:
        if self.type == "tool" and self.name is None:
            raise ValueError('tool_choice of type "tool" needs the "name" of the tool')
        return self


class ThinkingIn(Lenient):
    """Extended thinking: on (``budget_tokens`` is accepted, not enforced) or off."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class OutputFormatIn(Lenient):
    """Structured outputs: the reply is JSON matching ``schema``, grammar-certain."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfigIn(Lenient):
    """``output_config``: its ``format`` is followed; ``effort`` changes nothing here."""

    format: OutputFormatIn | None = None


class CountTokensRequest(Lenient):
    """``POST /v1/messages/count_tokens``: what the prompt is made of."""

    model: str
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    output_config: OutputConfigIn | None = None
    # Changes nothing for a local model; typed so a wrong one is still a 400.
    metadata: dict[str, Any] | None = None
    # draftpen's extension, as in chat completions and Responses: steer or turn off
    # speculation for this request.
    speculative: Speculative | None = None


RequestT = TypeVar("RequestT", bound=CountTokensRequest)


def parse_messages_request(model: type[RequestT], data: object) -> RequestT:
    """``data`` validated as ``model``; a 400 naming the field when it is not."""
    if not isinstance(data, dict):
        raise ApiError(400, f"The request body must be a JSON object, not {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise invalid_field(error) from None


def invalid_at(where: str, message: str) -> ApiError:
    return ApiError(400, f"Invalid {where}: {message}.", param=where, code="invalid_value")


def invalid_field(error: ValidationError, prefix: str = "") -> ApiError:
    """The first problem pydantic found, named as a field path (``messages[0].role``)."""
    return validation_error(error, prefix=prefix, noun="field")
