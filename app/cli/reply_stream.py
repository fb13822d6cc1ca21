"""A reply streamed to a terminal, a thinking model's reasoning kept apart from its answer.

``generate`` and the plain chat print the answer to standard output; reasoning (Qwen3's
``<think>`` block) goes to standard error, dimmed where that is a terminal, so a
pipeline that reads stdout gets the answer alone and a person still sees the thinking.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TextIO

from backends.generation_events import GenerationEvent
from backends.output.reasoning import ReasoningFormat, ReasoningSplit, ReasoningSplitter

DIM, RESET = "\x1b[2m", "\x1b[0m"


@dataclass
class ReplyStream:
    """Writes each event's answer to ``out`` and its reasoning to ``err``; keeps both."""

    reasoning: ReasoningFormat | None
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    # False: only collect (``generate --json`` prints one object at the end).
    echo: bool = True
    answer: str = ""
    reasoning_text: str = ""
    reasoning_tokens: int = 0

    def __post_init__(self) -> None:
        self._splitter = ReasoningSplitter(self.reasoning) if self.reasoning else None
        self._reasoning_open = False

    def add(self, event: GenerationEvent) -> None:
        """Take one event of the loop: print and keep its answer and reasoning."""
        if self._splitter is None:
            split = ReasoningSplit(answer=event.segments)
        else:
            split = self._splitter.feed(event.segments, len(event.tokens))
            if event.finish_reason is not None:
                split = split + self._splitter.finish()
        self.reasoning_tokens += split.reasoning_tokens
        if split.reasoning_text:
            self.reasoning_text += split.reasoning_text
            self._write_reasoning(split.reasoning_text)
        if split.answer_text:
            self._close_reasoning()
            self.answer += split.answer_text
            if self.echo:
                self.out.write(split.answer_text)
                self.out.flush()
        if event.finish_reason is not None:
            self._close_reasoning()

    def _write_reasoning(self, text: str) -> None:
        if not self.echo:
            return
        dim = self.err.isatty()
        if not self._reasoning_open:
            self.err.write((DIM if dim else "") + "(thinking) ")
            self._reasoning_open = True
        elif dim:
            self.err.write(DIM)
        self.err.write(text + (RESET if dim else ""))
        self.err.flush()

    def _close_reasoning(self) -> None:
        if self._reasoning_open:
            self.err.write("\n")
            self.err.flush()
            self._reasoning_open = False
