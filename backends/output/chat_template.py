"""Chat templates: a conversation to prompt text, with the model's own template.

GGUF files (``tokenizer.chat_template``) and MLX repos (``tokenizer_config.json``)
carry a Jinja template written for Hugging Face transformers; rendering it with a
sandboxed Jinja environment is what transformers itself does, so every model
family's format (ChatML, Llama 3, Gemma, ...) comes out right without a table of
formats here. Models without a template get ChatML, as llama.cpp does.

Tools and tool calls reach the template as transformers passes them: ``tools`` is a
list of ``{"type": "function", "function": {name, description, parameters}}``, an
assistant message's ``tool_calls`` are ``{"id", "type", "function": {name,
arguments}}`` with the arguments as a JSON object (templates write them with
``tojson``), and a ``tool`` message carries ``tool_call_id`` and ``name``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from backends.base import ChatMessage, Model, ToolCall, ToolSpec
from backends.errors import BackendError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(BackendError):
    """The model's chat template could not be rendered."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"The model's chat template refused the conversation: {message}")


def _strftime_now(date_format: str) -> str:
    return datetime.datetime.now().strftime(date_format)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson sorts keys and escapes <, > and & for HTML; the templates were
    # written for transformers' plain json.dumps, and the model saw that text in training.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.filters["tojson"] = _tojson
    return environment


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    return _environment().from_string(template)


@lru_cache(maxsize=8)
def template_takes_tools(template: str | None) -> bool:
    """Whether a chat template reads the ``tools`` variable (so it can show them)."""
    if not template:
        return False
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(_environment().parse(template))
    except jinja2.TemplateError:
        return False


def _arguments_value(arguments: str) -> object:
    # Templates expect the arguments as an object (``tojson`` writes it back); text that
    # is not JSON is passed as it is rather than refused.
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _call_dict(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": _arguments_value(call.arguments)},
    }


def _message_dict(message: ChatMessage) -> dict[str, Any]:
    # Keys are present only when they mean something: templates test `'tool_calls' in
    # message` (Llama 3.1) as well as `message.tool_calls`.
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [_call_dict(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        rendered["name"] = message.name
    return rendered


def _tool_dict(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = dict(tool.parameters)
    return {"type": "function", "function": function}


def render_chat(
    template: str | None,
    messages: Sequence[ChatMessage],
    *,
    tools: Sequence[ToolSpec] = (),
    bos_token: str = "",
    eos_token: str = "",
    template_variables: Mapping[str, Any] | None = None,
) -> str:
    """Render ``messages`` (and ``tools``) with ``template`` (ChatML when None).

    The text ends where the assistant's reply begins. Without tools the template's
    ``tools`` variable is left undefined, as transformers leaves it.
    ``template_variables`` are extra variables the template reads (Qwen3's
    ``enable_thinking``), as transformers' ``apply_chat_template(**kwargs)`` passes them.
    """
    variables: dict[str, Any] = dict(template_variables or {})
    if tools:
        variables["tools"] = [_tool_dict(tool) for tool in tools]
    try:
        compiled = _compile(template or CHATML_TEMPLATE)
        return compiled.render(
            messages=[_message_dict(message) for message in messages],
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
            **variables,
        )
    except (jinja2.TemplateError, TypeError) as error:
        # A TypeError is a template adding text to something that is not (its bug or an
        # unusual conversation); either way the request cannot be rendered.
        raise ChatTemplateError(
            f"The model's chat template could not be rendered ({error}). "
            "Use --raw to send the prompt text as it is."
        ) from error


def render_with_model_tokens(
    model: Model,
    template: str | None,
    messages: Sequence[ChatMessage],
    *,
    tools: Sequence[ToolSpec] = (),
    template_variables: Mapping[str, Any] | None = None,
) -> str:
    """:func:`render_chat` with the model's own BOS and EOS text as the template's
    ``bos_token`` / ``eos_token`` (what both runtimes' ``apply_chat_template`` do)."""
    info = model.vocab_info()
    return render_chat(
        template,
        messages,
        tools=tools,
        bos_token=model.token_text(info.bos_id) if info.bos_id >= 0 else "",
        eos_token=model.token_text(info.eos_id) if info.eos_id >= 0 else "",
        template_variables=template_variables,
    )


def model_chat_template(model: object) -> str | None:
    """The Jinja template a runtime renders with (its ``chat_template``), None if none.

    llama.cpp and MLX models keep it as ``chat_template``; the tool-call syntax is read
    from this text.
    """
    template = getattr(model, "chat_template", None)
    return template if isinstance(template, str) and template else None
