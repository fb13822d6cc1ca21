"""A scripted model that thinks aloud, behind Qwen3's own chat template.

No small reasoning model is published on PyPI (the only source the test machines
reach; see README "Reasoning"), so the reasoning tests use Qwen3's published chat
template (tests/templates/qwen3.jinja, with its ``enable_thinking`` switch) over
:class:`~tests.support.byte_model.ScriptedByteModel`. Each scripted reply is written the way
Qwen3 writes one, ``<think>\\n...\\n</think>\\n\\nanswer``; when the template closed an
empty think block in the prompt (thinking off), the model writes the answer alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from backends.base import ChatMessage, ToolSpec
from backends.engine import Engine
from backends.output.chat_template import render_chat
from tests.support.byte_model import ASSISTANT, EOS, N_VOCAB, ScriptedByteModel

QWEN3_TEMPLATE = (Path(__file__).parents[1] / "templates" / "qwen3.jinja").read_text(
    encoding="utf-8"
)
# What the template appends after the assistant marker when thinking is off.
EMPTY_THINK = "<think>\n\n</think>\n\n"
ASSISTANT_TURN = "<|im_start|>assistant\n"


def thinking_reply(reasoning: str, answer: str) -> str:
    """A reply as Qwen3 writes it."""
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


class ThinkingByteModel(ScriptedByteModel):
    """Scripted replies (written as :func:`thinking_reply`) behind the Qwen3 template."""

    chat_template = QWEN3_TEMPLATE

    def __init__(self, replies: Sequence[str], **options: Any) -> None:
        super().__init__(replies, **options)
        # The same replies without their reasoning, for prompts that turned thinking off.
        self.plain_replies = [
            self._bytes_tokens(reply.split("</think>")[-1].lstrip("\n").encode())
            for reply in replies
        ]
        self._empty_think = self._bytes_tokens(EMPTY_THINK.encode())

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        template_variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The conversation in Qwen3's template."""
        return render_chat(
            self.chat_template, messages, tools=tools, template_variables=template_variables
        )

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """As the byte model, with Qwen3's assistant turn as the byte model's marker."""
        marked = text.replace(ASSISTANT_TURN, "<|assistant|>")
        return super().tokenize(marked, add_special=add_special)

    def _logits_after(self, context: Sequence[int]) -> np.ndarray:
        markers = [index for index, token in enumerate(context) if token == ASSISTANT]
        if not markers:
            return super()._logits_after(context)
        turn = min(len(markers), len(self.replies)) - 1
        after = list(context[markers[-1] + 1 :])
        script, written = self.replies[turn], len(after)
        if after[: len(self._empty_think)] == self._empty_think:
            script, written = self.plain_replies[turn], len(after) - len(self._empty_think)
        row = np.zeros(N_VOCAB, dtype=np.float32)
        row[script[written] if written < len(script) else EOS] = 30.0
        return row


def thinking_engine(replies: Sequence[str], *, with_draft: bool = True) -> Engine:
    """An engine over :class:`ThinkingByteModel`, with an identical draft model."""
    draft = ThinkingByteModel(replies, name="thinking-draft") if with_draft else None
    return Engine(ThinkingByteModel(replies, name="thinking-target"), draft)
