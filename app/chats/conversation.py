"""Fitting a conversation into the model's context window.

A long chat outgrows the context; rather than refuse the next message, the oldest turns
are left out of the prompt (the history keeps them) until the prompt leaves room for a
reply. The system prompt and the newest message always stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backends.base import ChatMessage
from backends.engine import Engine

# The reply gets at least this share of the context, even when max_tokens asks for more.
MIN_REPLY_SHARE = 0.25


@dataclass(frozen=True)
class FittedPrompt:
    """The prompt tokens, and how many of the oldest messages were left out."""

    tokens: tuple[int, ...]
    dropped_messages: int
    # The prompt as the chat template rendered it (where the reply starts, whether the
    # template opened a reasoning block).
    text: str = ""


def fit_conversation(
    engine: Engine,
    messages: Sequence[ChatMessage],
    max_tokens: int,
    *,
    thinking: bool | None = None,
) -> FittedPrompt:
    """Prompt tokens for ``messages``, dropping the oldest turns until a reply fits.

    Room is kept for ``max_tokens`` of reply, or a quarter of the context if that is
    less. When even the newest message alone is too long, its tokens are returned as
    they are and the loop reports that the prompt does not fit. ``thinking`` False turns
    a thinking model's reasoning off through its template's switch.
    """
    system = [message for message in messages[:1] if message.role == "system"]
    turns = list(messages[len(system) :])
    budget = engine.target.n_ctx - min(max_tokens, int(engine.target.n_ctx * MIN_REPLY_SHARE))
    dropped = 0
    while True:
        text = engine.chat_prompt_text([*system, *turns], thinking=thinking)
        tokens = engine.text_prompt(text)
        if len(tokens) <= budget or len(turns) <= 1:
            return FittedPrompt(tuple(tokens), dropped, text)
        # Drop a whole exchange where possible, so the prompt never starts mid-answer.
        cut = 2 if len(turns) > 2 and turns[1].role == "assistant" else 1
        turns = turns[cut:]
        dropped += cut
