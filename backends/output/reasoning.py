"""Reasoning shown apart: a model's thinking aloud, separated from its answer as it streams.

Models such as Qwen3, QwQ and the DeepSeek-R1 distills write their reasoning first, between
``<think>`` and ``</think>``, then the answer. Whether a model does is read from its chat
template (the template names the tags, to strip old reasoning from the conversation), never
from its name. Some templates open the block themselves: the prompt then ends with
``<think>`` and the reply starts inside the reasoning, writing only the closing tag.

:class:`ReasoningSplitter` takes the loop's text as it arrives (with provenance, so the
draft tint survives) and returns what is reasoning and what is answer, holding back a tail
that could still be the start of a tag. As llama.cpp's server does, reasoning is only
recognised at the start of the reply; a ``<think>`` later in the answer is answer text.
The whitespace around the tags (``<think>\\n``, ``\\n</think>\\n\\n``) belongs to neither.

Templates with a thinking switch (Qwen3's ``enable_thinking`` Jinja variable) turn it off
with that variable: :func:`thinking_variables` says what to render with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from backends.generation_events import TextSegment

# (start, end) tag pairs that templates use for reasoning, in the order they are tried.
REASONING_TAGS: tuple[tuple[str, str], ...] = (("<think>", "</think>"),)
# The Jinja variable Qwen3 (and SmolLM3, and the templates that copied it) read to turn
# thinking off; llama.cpp's server and vLLM pass it as chat_template_kwargs.
THINKING_SWITCH = "enable_thinking"


@dataclass(frozen=True)
class ReasoningFormat:
    """How one model's replies mark reasoning, for one prompt.

    ``starts_inside``: the prompt ended with the start tag (the template opened the
    block), so the reply begins as reasoning and only the end tag will follow.
    """

    start: str = "<think>"
    end: str = "</think>"
    starts_inside: bool = False


@lru_cache(maxsize=8)
def template_reasoning_tags(template: str | None) -> tuple[str, str] | None:
    """The reasoning tags a template writes or strips; None for a model that does not think."""
    if not template:
        return None
    return next((tags for tags in REASONING_TAGS if tags[1] in template), None)


@lru_cache(maxsize=8)
def template_has_thinking_switch(template: str | None) -> bool:
    """Whether the template reads :data:`THINKING_SWITCH` (so thinking can be turned off)."""
    if not template or THINKING_SWITCH not in template:
        return False
    try:
        parsed = ImmutableSandboxedEnvironment().parse(template)
    except jinja2.TemplateError:
        return False
    return THINKING_SWITCH in jinja2.meta.find_undeclared_variables(parsed)


def thinking_variables(template: str | None, thinking: bool | None) -> dict[str, Any]:
    """The template variables that ask for ``thinking`` (None: the template's default).

    Empty where the template has no switch: such a model thinks (or not) regardless.
    """
    if thinking is None or not template_has_thinking_switch(template):
        return {}
    return {THINKING_SWITCH: thinking}


def reasoning_format(template: str | None, prompt_text: str) -> ReasoningFormat | None:
    """How the reply to ``prompt_text`` marks reasoning (None: the model does not think)."""
    tags = template_reasoning_tags(template)
    if tags is None:
        return None
    start, end = tags
    return ReasoningFormat(start, end, starts_inside=prompt_text.rstrip().endswith(start))


@dataclass(frozen=True)
class ReasoningSplit:
    """What one piece of the loop's text turned out to be.

    ``reasoning`` and ``answer`` are runs of text with their provenance (tags and the
    whitespace around them dropped); the token counts attribute the piece's tokens.
    """

    reasoning: tuple[TextSegment, ...] = ()
    answer: tuple[TextSegment, ...] = ()
    reasoning_tokens: int = 0
    answer_tokens: int = 0

    @property
    def reasoning_text(self) -> str:
        """The reasoning as plain text."""
        return "".join(segment.text for segment in self.reasoning)

    @property
    def answer_text(self) -> str:
        """The answer as plain text."""
        return "".join(segment.text for segment in self.answer)

    def __add__(self, other: ReasoningSplit) -> ReasoningSplit:
        return ReasoningSplit(
            self.reasoning + other.reasoning,
            self.answer + other.answer,
            self.reasoning_tokens + other.reasoning_tokens,
            self.answer_tokens + other.answer_tokens,
        )


class _Phase(Enum):
    OPENING = "opening"  # the reply's first characters: a start tag may come
    REASONING = "reasoning"
    ANSWER_START = "answer_start"  # just after the end tag: whitespace is dropped
    ANSWER = "answer"


@dataclass
class _Piece:
    """A fed piece whose tokens are not attributed yet: where its text lies in the reply."""

    start: int
    end: int
    tokens: int


@dataclass
class _Pending:
    """Text held back, and the pieces whose tokens are not attributed yet."""

    segments: list[TextSegment] = field(default_factory=list)
    pieces: list[_Piece] = field(default_factory=list)
    # Where ``segments`` starts in the reply (characters released or dropped before it).
    offset: int = 0
    # Characters fed so far.
    fed: int = 0

    @property
    def text(self) -> str:
        return "".join(segment.text for segment in self.segments)

    def tokens_before(self, position: int) -> int:
        """Attribute the tokens of the text before ``position``; later ones stay pending.

        A piece that straddles ``position`` is shared out by characters.
        """
        taken = 0
        kept: list[_Piece] = []
        for piece in self.pieces:
            if piece.end <= position:
                taken += piece.tokens
            elif piece.start < position:
                share = round(piece.tokens * (position - piece.start) / (piece.end - piece.start))
                taken += share
                kept.append(_Piece(position, piece.end, piece.tokens - share))
            else:
                kept.append(piece)
        self.pieces = kept
        return taken

    def all_tokens(self) -> int:
        """Attribute every pending piece's tokens."""
        tokens = sum(piece.tokens for piece in self.pieces)
        self.pieces = []
        return tokens


class ReasoningSplitter:
    """Splits a reply into reasoning and answer as its text streams in.

    Feed every event's segments (and its token count) to :meth:`feed`, then call
    :meth:`finish` once at the end to release what was held back. Each piece's tokens
    belong to the side its text fell on (the tags count as reasoning); only a piece
    that straddles the end tag has its tokens shared out by characters.
    """

    def __init__(self, reasoning_format: ReasoningFormat) -> None:
        self.format = reasoning_format
        self._phase = _Phase.REASONING if reasoning_format.starts_inside else _Phase.OPENING
        self._pending = _Pending()
        # Reasoning's leading whitespace is dropped; its trailing whitespace is held
        # until more reasoning follows (then it was inner whitespace) or the end tag.
        self._reasoning_started = False

    def feed(self, segments: Sequence[TextSegment], tokens: int = 0) -> ReasoningSplit:
        """Add the next piece of the reply; returns what is now known of it."""
        if self._phase is _Phase.ANSWER:
            return ReasoningSplit(answer=_nonempty(segments), answer_tokens=tokens)
        pending = self._pending
        length = sum(len(segment.text) for segment in segments)
        pending.segments.extend(segment for segment in segments if segment.text)
        pending.pieces.append(_Piece(pending.fed, pending.fed + length, tokens))
        pending.fed += length
        return self._advance(final=False)

    def finish(self) -> ReasoningSplit:
        """The reply ended: release what was held back (a partial tag is plain text)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> ReasoningSplit:
        result = ReasoningSplit()
        while True:
            step, done = self._step(final)
            result = result + step
            if done:
                return result

    def _step(self, final: bool) -> tuple[ReasoningSplit, bool]:
        """One state change at most; returns what it released and whether to stop."""
        text = self._pending.text
        if self._phase is _Phase.OPENING:
            opening = text.lstrip()
            if opening.startswith(self.format.start):
                # The start tag and its whitespace are dropped; the tokens stay pending
                # and are counted with the reasoning they open.
                self._drop(len(text) - len(opening) + len(self.format.start))
                self._phase = _Phase.REASONING
                return ReasoningSplit(), False
            if not final and self.format.start.startswith(opening):
                return ReasoningSplit(), True  # still could be the start tag
            self._phase = _Phase.ANSWER
            return self._release_answer(), True
        if self._phase is _Phase.REASONING:
            return self._step_reasoning(text, final)
        # ANSWER_START: whitespace after the end tag belongs to neither side.
        stripped = text.lstrip()
        self._drop(len(text) - len(stripped))
        if not stripped:
            return self._settle_tokens(reasoning=False), True
        self._phase = _Phase.ANSWER
        return self._release_answer(), True

    def _step_reasoning(self, text: str, final: bool) -> tuple[ReasoningSplit, bool]:
        if not self._reasoning_started:
            stripped = text.lstrip()
            self._drop(len(text) - len(stripped))
            text = stripped
            if not text:
                # Nothing but whitespace yet; at the end, its tokens were reasoning.
                return (self._settle_tokens(reasoning=True) if final else ReasoningSplit()), True
            self._reasoning_started = True
        end_at = text.find(self.format.end)
        if end_at >= 0:
            body = text[:end_at].rstrip()
            tag_end = end_at + len(self.format.end)
            reasoning_tokens = self._pending.tokens_before(self._pending.offset + tag_end)
            released = self._take(len(body))
            self._drop(tag_end - len(body))
            split = ReasoningSplit(reasoning=released, reasoning_tokens=reasoning_tokens)
            self._phase = _Phase.ANSWER_START
            return split, False
        if final:
            released = self._take(len(text.rstrip()))
            self._drop(len(self._pending.text))
            return self._with_tokens(released, reasoning=True), True
        keep = _partial_tag_length(text, self.format.end)
        releasable = text[: len(text) - keep].rstrip()
        released = self._take(len(releasable))
        return self._with_tokens(released, reasoning=True), True

    def _release_answer(self) -> ReasoningSplit:
        released = self._take(len(self._pending.text))
        return self._with_tokens(released, reasoning=False)

    def _with_tokens(self, segments: tuple[TextSegment, ...], *, reasoning: bool) -> ReasoningSplit:
        split = self._settle_tokens(reasoning)
        if reasoning:
            return ReasoningSplit(reasoning=segments, reasoning_tokens=split.reasoning_tokens)
        return ReasoningSplit(answer=segments, answer_tokens=split.answer_tokens)

    def _settle_tokens(self, reasoning: bool) -> ReasoningSplit:
        tokens = self._pending.all_tokens()
        if reasoning:
            return ReasoningSplit(reasoning_tokens=tokens)
        return ReasoningSplit(answer_tokens=tokens)

    def _take(self, count: int) -> tuple[TextSegment, ...]:
        head, self._pending.segments = split_segments(self._pending.segments, count)
        self._pending.offset += count
        return tuple(head)

    def _drop(self, count: int) -> None:
        self._pending.segments = split_segments(self._pending.segments, count)[1]
        self._pending.offset += count


def split_segments(
    segments: Sequence[TextSegment], count: int
) -> tuple[list[TextSegment], list[TextSegment]]:
    """The first ``count`` characters of ``segments`` and the rest, provenance kept."""
    head: list[TextSegment] = []
    tail: list[TextSegment] = []
    left = count
    for segment in segments:
        if left >= len(segment.text):
            head.append(segment)
            left -= len(segment.text)
        elif left > 0:
            head.append(TextSegment(segment.text[:left], segment.from_draft))
            tail.append(TextSegment(segment.text[left:], segment.from_draft))
            left = 0
        else:
            tail.append(segment)
    return head, tail


def _nonempty(segments: Sequence[TextSegment]) -> tuple[TextSegment, ...]:
    return tuple(segment for segment in segments if segment.text)


def _partial_tag_length(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag``."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0
