"""An OpenAI Responses API request, validated and read as the engine's one chat request.

``POST /v1/responses`` takes ``input`` (a string, or items: :mod:`.responses_items`),
``instructions``,
function ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``text.format``,
``max_output_tokens``, ``reasoning.effort``, ``temperature``, ``top_p``, ``stream``,
``store``, ``previous_response_id``, ``truncation`` and ``metadata``. :func:`read_turn`
turns one into a
:class:`~app.engine.dialects.openai_chat_schema.ChatCompletionRequest` (the same
prompt, grammar and loop as chat completions) plus what the response object echoes
back.

Unknown top-level fields are ignored, as agents send many that change nothing for a
local model (Codex: ``include``, ``prompt_cache_key``, ``client_metadata``,
``service_tier``); the fields read here are type-checked like chat's. Tools of a type a
local model cannot serve (:data:`HOSTED_TOOL_TYPES`, and any other type but
``function``) are left out unless ``tool_choice`` requires one, which is a 400.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from app.engine.dialects.openai_chat_schema import ChatCompletionRequest
from app.engine.dialects.responses_items import (
    InputItem,
    Lenient,
    chat_messages,
    parse_items,
)
from app.engine.schema import (
    ApiError,
    FunctionDefinition,
    JsonSchemaFormat,
    Speculative,
    invalid,
    parse_request,
    validation_error,
)

# Tool types the Responses API (and Codex) define that run on OpenAI's side or need a
# harness draftpen does not have: they are ignored, not refused, so that agents which
# always send them still work. The README lists them.
HOSTED_TOOL_TYPES = (
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "image_generation",
    "local_shell",
    "shell",
    "apply_patch",
    "mcp",
    "custom",
    "namespace",
    "tool_search",
)

# reasoning.effort, as chat's reasoning_effort ("xhigh" is as much thinking as "high").
_EFFORTS = {"xhigh": "high"}


class FunctionTool(FunctionDefinition):
    """A ``tools[]`` entry of type ``function`` (flat: name and parameters at the top)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    type: Literal["function"]


class TextFormat(Lenient):
    """``text.format``: plain text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Lenient):
    """``text``: its ``format`` is read; ``verbosity`` changes nothing here."""

    format: TextFormat | None = None


class ReasoningConfig(Lenient):
    """``reasoning``: ``effort`` none/minimal turns a thinking model's thinking off."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


class ResponsesRequest(Lenient):
    """``POST /v1/responses``: the fields draftpen reads."""

    model: str
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    reasoning: ReasoningConfig | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # "auto" leaves out the oldest turns that do not fit (draftpen's fit_context).
    truncation: Literal["auto", "disabled"] | None = None
    # What draftpen cannot do: refused when set, rather than silently ignored.
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    # draftpen's extension, as in chat completions.
    speculative: Speculative | None = None


@dataclass(frozen=True)
class ResponsesTurn:
    """A Responses request read as a chat request, and what its answer echoes back."""

    chat: ChatCompletionRequest
    # The request's fields as the response object repeats them.
    echo: dict[str, Any]
    # Every input item of the conversation (a previous response's first, then its
    # output, then this request's input), kept with this response when it is stored.
    conversation: tuple[InputItem, ...]
    store: bool


def parse_responses_request(body: object) -> ResponsesRequest:
    """The request's known fields, type-checked; raises :class:`ApiError` (400)."""
    if not isinstance(body, dict):
        raise ApiError(
            400,
            f"The request body must be a JSON object, not {type(body).__name__}.",
            code="invalid_type",
        )
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError as error:
        raise validation_error(error) from None
    if request.background:
        raise invalid("background", "draftpen answers in the foreground only; send false")
    for name in ("conversation", "prompt"):
        if getattr(request, name) is not None:
            raise invalid(
                name,
                "draftpen keeps no conversations or prompt templates; send the items in "
                "input, or continue with previous_response_id",
            )
    return request


def read_turn(request: ResponsesRequest, earlier: Sequence[InputItem] = ()) -> ResponsesTurn:
    """``request`` as a chat request; ``earlier`` is the previous response's conversation."""
    items = parse_items(request.input)
    if not items and not earlier:
        raise ApiError(
            400,
            "Missing required parameter 'input': send a string or a list of items.",
            param="input",
            code="missing_required_parameter",
        )
    functions, hosted = function_tools(request.tools)
    choice, functions = _tool_choice(request.tool_choice, functions, hosted)
    chat: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request.instructions, earlier, items),
        "stream": request.stream,
    }
    if functions:
        chat["tools"] = [_chat_tool(tool) for tool in functions]
        if choice is not None:
            chat["tool_choice"] = choice
    if request.parallel_tool_calls is not None:
        chat["parallel_tool_calls"] = request.parallel_tool_calls
    text_format = request.text.format if request.text else None
    response_format = _response_format(text_format)
    if response_format is not None:
        chat["response_format"] = response_format
    effort = request.reasoning.effort if request.reasoning else None
    optional = {
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "reasoning_effort": _EFFORTS.get(effort, effort) if effort else None,
        "speculative": request.speculative.model_dump(exclude_none=True)
        if request.speculative
        else None,
        "draftpen": {"fit_context": True} if request.truncation == "auto" else None,
    }
    chat.update({name: value for name, value in optional.items() if value is not None})
    echo = {
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "metadata": request.metadata or {},
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": {
            "effort": effort,
            "summary": request.reasoning.summary if request.reasoning else None,
        },
        "store": request.store,
        "temperature": request.temperature,
        "text": {
            "format": text_format.model_dump(by_alias=True, exclude_none=True)
            if text_format
            else {"type": "text"}
        },
        "tool_choice": request.tool_choice or "auto",
        "tools": [tool.model_dump(exclude_none=True) for tool in functions],
        "top_p": request.top_p,
        "truncation": request.truncation or "disabled",
        "user": request.user,
    }
    return ResponsesTurn(
        chat=parse_request(ChatCompletionRequest, chat),
        echo=echo,
        conversation=(*earlier, *items),
        store=request.store,
    )


def function_tools(raw: list[Any] | None) -> tuple[list[FunctionTool], list[str]]:
    """The function tools, checked, and the types of the tools left out."""
    functions: list[FunctionTool] = []
    hosted: list[str] = []
    for index, tool in enumerate(raw or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            raise invalid(f"tools[{index}]", "must be a tool object with a 'type'")
        if kind != "function":
            hosted.append(kind)
            continue
        try:
            function = FunctionTool.model_validate(tool)
        except ValidationError as error:
            raise validation_error(error, prefix=f"tools[{index}]") from None
        if any(known.name == function.name for known in functions):
            raise invalid(f"tools[{index}].name", f"{function.name!r} is named twice")
        functions.append(function)
    return functions, hosted


def _tool_choice(
    choice: str | dict[str, Any] | None, functions: list[FunctionTool], hosted: list[str]
) -> tuple[str | dict[str, Any] | None, list[FunctionTool]]:
    """Chat's ``tool_choice``, and the functions it leaves the model."""
    left_out = (
        f" (the tools sent besides functions, of types {', '.join(sorted(set(hosted)))}, are "
        "ignored: a local model cannot serve them)"
        if hosted
        else ""
    )
    if choice is None or choice in ("none", "auto"):
        return choice, functions
    if choice == "required":
        if not functions:
            raise invalid("tool_choice", f"'required' needs a function in tools{left_out}")
        return choice, functions
    assert isinstance(choice, dict)
    kind = choice.get("type")
    names = [tool.name for tool in functions]
    if kind == "function":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            offered = ", ".join(repr(known) for known in names) or "none"
            raise invalid(
                "tool_choice",
                f"names the function {name!r}, which is not in tools (offered: {offered})",
            )
        return {"type": "function", "function": {"name": name}}, functions
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        listed = choice.get("tools")
        if mode not in ("auto", "required") or not isinstance(listed, list):
            raise invalid(
                "tool_choice",
                "allowed_tools takes 'mode' ('auto' or 'required') and a list of 'tools'",
            )
        allowed = {
            tool.get("name")
            for tool in listed
            if isinstance(tool, dict) and tool.get("type") == "function"
        }
        kept = [tool for tool in functions if tool.name in allowed]
        if mode == "required" and not kept:
            raise invalid("tool_choice", f"allowed_tools lists no function of tools{left_out}")
        return mode, kept
    raise invalid(
        "tool_choice",
        f"requires a tool of type {kind!r}, which draftpen cannot serve (a local model runs "
        "function tools only); send 'auto', 'required' or a function",
    )


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    """A function tool in chat's nested shape; strict unless it says otherwise."""
    function = tool.model_dump(exclude={"type"}, exclude_none=True)
    # The Responses API makes function tools strict by default; chat does not.
    function["strict"] = tool.strict is not False
    return {"type": "function", "function": function}


def _response_format(text_format: TextFormat | None) -> dict[str, Any] | None:
    """Chat's ``response_format`` for ``text.format``; None for plain text."""
    if text_format is None or text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return {"type": "json_object"}
    if text_format.schema_ is None:
        raise ApiError(
            400,
            "Missing required parameter 'text.format.schema': a json_schema format needs "
            'its schema: {"type": "json_schema", "name": ..., "schema": {...}}.',
            param="text.format.schema",
            code="missing_required_parameter",
        )
    # The Responses API requires a name; clients written for other servers leave it out.
    fields = {"name": text_format.name or "response", "schema": text_format.schema_}
    if text_format.strict is not None:
        fields["strict"] = text_format.strict
    try:
        checked = JsonSchemaFormat.model_validate(
            {k: v for k, v in fields.items() if v is not None}
        )
    except ValidationError as error:
        raise validation_error(error, prefix="text.format") from None
    return {"type": "json_schema", "json_schema": checked.model_dump(by_alias=True)}
