"""The Responses API's conversation items, and the chat messages they make.

``input`` is a string (one user message) or a list of items: ``message`` (text parts
``input_text`` / ``output_text``; ``developer`` is read as ``system``),
``function_call`` (a call the model made), ``function_call_output`` (its result, or,
without a ``call_id``, a named output the client adds on its own: Codex sends its goal
as ``{"name": "goal_objective", "namespace": "agent", "output": ...}``, read as a user
turn that names it) and ``reasoning`` (accepted so that output can be sent back
unchanged, never shown to the model, as chat templates leave earlier reasoning out).
Known fields are type-checked, unknown ones ignored (Codex adds ``id``, ``status``,
``encrypted_content`` ...); other item types are refused by name. A response's output
items are valid input items, which is how ``previous_response_id`` continues a conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from app.engine.schema import ApiError, invalid, validation_error


class Lenient(BaseModel):
    """Known fields strictly typed; unknown ones ignored (clients send many)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


def _text_of_parts(value: object, what: str) -> object:
    """A string, or the Responses API's list of text parts joined."""
    if not isinstance(value, list):
        return value
    texts = []
    for part in value:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise ValueError(f"draftpen serves text models: no {kind} parts in {what}")
        text = part.get("refusal" if kind == "refusal" else "text") if kind else None
        if not isinstance(text, str):
            raise ValueError(
                f"{what} must be a string or a list of {{'type': 'input_text', 'text': ...}} "
                "parts (output_text for the assistant's)"
            )
        texts.append(text)
    return "".join(texts)


class MessageItem(Lenient):
    """A ``message`` item; ``developer`` is read as ``system``."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: object) -> object:
        return _text_of_parts(value, "content")


class FunctionCallItem(Lenient):
    """A ``function_call`` the model made, sent back with the conversation."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(Lenient):
    """The result of the earlier ``function_call`` with this ``call_id``; without one,
    an output the client adds by ``name`` (and ``namespace``), answering no call."""

    type: Literal["function_call_output"]
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    output: str

    @field_validator("output", mode="before")
    @classmethod
    def _parts(cls, value: object) -> object:
        return _text_of_parts(value, "output")


class ReasoningItem(Lenient):
    """A ``reasoning`` item: accepted so clients can send output back unchanged.

    It is not shown to the model, as chat templates leave out earlier turns' reasoning.
    """

    type: Literal["reasoning"]


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem

_ITEM_MODELS: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


def parse_items(value: str | list[Any] | None, where: str = "input") -> list[InputItem]:
    """``input`` as items: a string is one user message."""
    if value is None:
        return []
    if isinstance(value, str):
        return [MessageItem(role="user", content=value)]
    items: list[InputItem] = []
    for index, raw in enumerate(value):
        param = f"{where}[{index}]"
        if not isinstance(raw, dict):
            raise invalid(param, "must be an item object, such as {'role': 'user', 'content': ...}")
        # An "easy" input message may leave its type out.
        kind = raw.get("type", "message" if "role" in raw else None)
        model = _ITEM_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise invalid(
                f"{param}.type",
                f"draftpen reads {', '.join(_ITEM_MODELS)} items, not {kind!r} (items of "
                "tools a local model cannot serve have no place in its conversations)",
            )
        try:
            items.append(model.model_validate({**raw, "type": kind}))
        except ValidationError as error:
            raise validation_error(error, prefix=param) from None
    return items


def chat_messages(
    instructions: str | None, earlier: Sequence[InputItem], items: Sequence[InputItem]
) -> list[dict[str, Any]]:
    """The conversation as chat messages: calls join their assistant turn, results follow.

    Consecutive system and developer messages become one system message (templates
    that take a single one, at the start, still render Codex's two).
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    call_ids: set[str] = set()
    for index, item in enumerate((*earlier, *items)):
        last = messages[-1] if messages else None
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            if role == "system" and last is not None and last["role"] == "system":
                last["content"] += "\n\n" + item.content
            else:
                messages.append({"role": role, "content": item.content})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            call_ids.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem):
            where = f"input[{index - len(earlier)}]"
            if item.call_id is None:
                messages.append(_named_output(item, where))
                continue
            if item.call_id not in call_ids:
                raise invalid(
                    f"{where}.call_id",
                    f"{item.call_id!r} answers no function_call earlier in the conversation "
                    "(send the function_call item before it, or previous_response_id)",
                )
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return messages


def _named_output(item: FunctionCallOutputItem, where: str) -> dict[str, Any]:
    """An output that answers no call, as a user turn that names it (a ``tool`` turn
    must answer a call the model made, and this one's call was the client's own)."""
    if not item.name:
        raise ApiError(
            400,
            f"Missing required parameter '{where}.call_id': a function_call_output answers "
            "an earlier function_call by its call_id (or names its tool in name).",
            param=f"{where}.call_id",
            code="missing_required_parameter",
        )
    name = f"{item.namespace}.{item.name}" if item.namespace else item.name
    return {"role": "user", "content": f"[{name}]\n{item.output}"}
