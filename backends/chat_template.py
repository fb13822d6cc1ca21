"""Chat templates: a conversation to prompt text, with the model's own template.

GGUF files (``tokenizer.chat_template``) and MLX repos (``tokenizer_config.json``)
carry a Jinja template written for Hugging Face transformers; rendering it with a
sandboxed Jinja environment is what transformers itself does, so every model
family's format (ChatML, Llama 3, Gemma, ...) comes out right without a table of
formats here. Models without a template get ChatML, as llama.cpp does.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from backends.base import ChatMessage
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


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(template)


def render_chat(
    template: str | None,
    messages: Sequence[ChatMessage],
    *,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """Render ``messages`` with ``template`` (ChatML when None), ready for the reply."""
    try:
        compiled = _compile(template or CHATML_TEMPLATE)
        return compiled.render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.TemplateError as error:
        raise ChatTemplateError(
            f"The model's chat template could not be rendered ({error}). "
            "Use --raw to send the prompt text as it is."
        ) from error
