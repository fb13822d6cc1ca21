"""OpenAI Chat Completions' request: the one internal request every chat dialect becomes.

``POST /v1/chat/completions`` is validated into :class:`ChatCompletionRequest` (its
messages, tools, ``tool_choice``, ``response_format``, logprobs and thinking switch,
checked across fields); the Messages and Responses dialects translate their requests
into one, so the engine answers every chat the same way. The fields every generation
shares, and :func:`~app.engine.schema.parse_request`, are in ``app.engine.schema``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from app.engine.schema import (
    MAX_CHOICES,
    ApiError,
    FunctionDefinition,
    GenerationFields,
    JsonSchemaFormat,
    Strict,
    invalid,
    text_of,
)
from backends.base import ChatMessage, ToolCall, ToolSpec

MAX_TOOLS = 128


class FunctionCallIn(Strict):
    """The function an earlier assistant turn called, arguments as JSON text."""

    name: str
    arguments: str


class ToolCallIn(Strict):
    """An earlier assistant turn's tool call, sent back in the conversation."""

    id: str
    type: Literal["function"]
    function: FunctionCallIn


class Message(Strict):
    """One chat message; ``developer`` is treated as ``system``.

    Assistant turns may carry ``tool_calls`` (their ``content`` may then be null);
    ``tool`` turns answer one of those calls by ``tool_call_id``.
    """

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    # Sent back by clients that replay OpenAI's assistant messages; not shown to the model.
    refusal: str | None = None
    # An earlier reply's reasoning, as this server (and llama.cpp's, and vLLM) returned it:
    # accepted so clients can send messages back unchanged, and never shown to the model.
    reasoning_content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content_parts(cls, value: object) -> object:
        return text_of(value, "content")


class Tool(Strict):
    """One entry of ``tools``; functions are the only kind."""

    type: Literal["function"]
    function: FunctionDefinition

    def spec(self) -> ToolSpec:
        """The backend's description of this function."""
        function = self.function
        return ToolSpec(
            name=function.name,
            description=function.description,
            parameters=function.parameters or {"type": "object", "properties": {}},
            strict=bool(function.strict),
        )


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    """``tool_choice`` naming the one function to call."""

    type: Literal["function"]
    function: NamedFunction


class ResponseFormatField(Strict):
    """``response_format``: free text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormatField:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError(
                "response_format of type 'json_schema' needs a 'json_schema' object: "
                '{"name": ..., "schema": {...}, "strict": true}'
            )
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError("response_format.json_schema goes with type 'json_schema' only")
        return self


class ChatTemplateKwargs(Strict):
    """``chat_template_kwargs``, as llama.cpp's server and vLLM take it: template variables.

    Only the thinking switch is taken; other variables are refused by name rather than
    passed to a template that may not read them.
    """

    enable_thinking: bool | None = None


# reasoning_effort values (OpenAI's), and whether each asks for thinking at all.
REASONING_EFFORTS: dict[str, bool] = {
    "none": False,
    "minimal": False,
    "low": True,
    "medium": True,
    "high": True,
}


class ChatCompletionRequest(GenerationFields):
    """``POST /v1/chat/completions``."""

    max_choices: ClassVar[int] = MAX_CHOICES

    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormatField | None = None
    # The target's log-probabilities of the reply's tokens, and top_logprobs alternatives.
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # Thinking on or off for a model that reasons aloud, through its template's switch:
    # chat_template_kwargs.enable_thinking, else reasoning_effort ("none"/"minimal": off).
    chat_template_kwargs: ChatTemplateKwargs | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # Change nothing for a local model; accepted and ignored.
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    verbosity: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    modalities: list[str] | None = None

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and value != ["text"]:
            raise ValueError('draftpen writes text only; send ["text"] or leave it out')
        return value

    @property
    def requested_logprobs(self) -> int | None:
        """``top_logprobs`` (0 when left out) once ``logprobs`` is true; else None."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def thinking(self) -> bool | None:
        """Whether the request asks for thinking (None: it does not say).

        ``chat_template_kwargs.enable_thinking`` wins over ``reasoning_effort``.
        """
        kwargs = self.chat_template_kwargs
        if kwargs is not None and kwargs.enable_thinking is not None:
            return kwargs.enable_thinking
        if self.reasoning_effort is not None:
            return REASONING_EFFORTS[self.reasoning_effort]
        return None

    def check(self) -> None:
        """The field rules, then the conversation's and the tools' rules."""
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise invalid(
                "top_logprobs", "it needs logprobs: true (send both, or leave top_logprobs out)"
            )
        self._check_messages()
        self._check_tools()

    def _check_messages(self) -> None:
        call_ids: set[str] = set()
        for index, message in enumerate(self.messages):
            where = f"messages[{index}]"
            if message.tool_calls and message.role != "assistant":
                raise invalid(f"{where}.tool_calls", "only assistant messages carry tool_calls")
            if message.role == "tool":
                if message.tool_call_id is None:
                    raise ApiError(
                        400,
                        f"Missing required parameter '{where}.tool_call_id': a tool message "
                        "answers one of the earlier assistant message's tool_calls by its id.",
                        param=f"{where}.tool_call_id",
                        code="missing_required_parameter",
                    )
                if message.tool_call_id not in call_ids:
                    raise invalid(
                        f"{where}.tool_call_id",
                        f"{message.tool_call_id!r} answers no tool call of an earlier assistant "
                        "message; send the id from that message's tool_calls",
                    )
            elif message.tool_call_id is not None:
                raise invalid(f"{where}.tool_call_id", "only tool messages carry tool_call_id")
            if message.content is None and not (message.role == "assistant" and message.tool_calls):
                raise ApiError(
                    400,
                    f"Missing required parameter '{where}.content' (only an assistant message "
                    "with tool_calls may leave it null).",
                    param=f"{where}.content",
                    code="missing_required_parameter",
                )
            call_ids.update(call.id for call in message.tool_calls or ())

    def _check_tools(self) -> None:
        names = [tool.function.name for tool in self.tools or ()]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise invalid(f"tools[{index}].function.name", f"{name!r} is named twice")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            offered = ", ".join(repr(name) for name in names) or "none"
            raise invalid(
                "tool_choice",
                f"names the function {choice.function.name!r}, which is not in tools "
                f"(offered: {offered})",
            )
        if choice == "required" and not names:
            raise invalid("tool_choice", "'required' needs at least one function in tools")

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The functions offered, for the chat template and the constraint."""
        return tuple(tool.spec() for tool in self.tools or ())

    def chat_messages(self) -> list[ChatMessage]:
        """The conversation in the backend's terms; tool results name their function."""
        functions: dict[str, str] = {}
        converted = []
        for message in self.messages:
            calls = tuple(
                ToolCall(call.id, call.function.name, call.function.arguments)
                for call in message.tool_calls or ()
            )
            functions.update((call.id, call.name) for call in calls)
            role = "system" if message.role == "developer" else message.role
            name = message.name
            if message.role == "tool" and message.tool_call_id is not None:
                name = functions.get(message.tool_call_id, name)
            converted.append(
                ChatMessage(
                    role,
                    message.content or "",
                    tool_calls=calls,
                    tool_call_id=message.tool_call_id,
                    name=name,
                )
            )
        return converted
