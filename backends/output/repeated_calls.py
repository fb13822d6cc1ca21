"""Ending a reply at the first tool call that repeats an earlier one.

Where a request allows parallel calls, the grammar lets a call follow a call, and a
small model greedily decoding can write the very same call again and again until
``max_tokens`` (issue 41: 23 identical Write calls). No agent wants a call repeated
with the same name and arguments in one reply: it would run the same thing twice.
:class:`RepeatedCallStop` reads the reply's text as the loop makes it, with the same
:class:`~backends.output.tool_calls.ToolCallParser` the server answers with, and ends the
reply where such a repeat begins: the repeat is not shown and the loop stops, as it
does at a stop string.

Only the answer is read: a thinking model's reasoning (``<think>...</think>`` at the
start of the reply, see ``reasoning.py``) may mention a call, which is not made, so
the answer's call is no repeat of it. Reasoning passes through as it comes.

Text that may still turn out to be a repeat (a call whose text so far is the start
of an earlier call's) is held back until it differs or ends; every other call streams
as it comes. Calls are compared by name and arguments (as JSON values); under the
grammar a model writes a call's JSON one way only, so the text comparison that decides
what is held back agrees with that.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from backends.generation_events import TextSegment
from backends.output.call_syntax import ToolCallSyntax
from backends.output.reasoning import ReasoningFormat
from backends.output.stop_strings import drop_chars, take_chars
from backends.output.tool_call_pieces import ParsedReply
from backends.output.tool_calls import ToolCallParser


class RepeatedCallStop:
    """Holds back text that may be a repeated call; cuts the reply where one begins."""

    def __init__(
        self,
        syntax: ToolCallSyntax,
        tool_names: Collection[str],
        reasoning: ReasoningFormat | None = None,
    ) -> None:
        self._parser = ToolCallParser(syntax, tool_names, new_id=lambda: "")
        self._calls = ParsedReply()
        self._reasoning = reasoning
        # Where the answer begins in the text (None: not known yet, reasoning may come).
        self._answer_at: int | None = None if reasoning is not None else 0
        self._text = ""  # all the text pushed
        self._held: list[TextSegment] = []  # pushed, not yet shown
        self._shown = 0  # characters shown so far
        self._judged = 0  # finished calls compared with the ones before them
        # Set once a repeat was found: the index of the call that repeated another.
        self.repeated_call: int | None = None

    def push(self, segments: Sequence[TextSegment]) -> tuple[list[TextSegment], bool]:
        """Add text; return what is safe to show and whether a repeated call ended it."""
        text = "".join(segment.text for segment in segments)
        self._held.extend(segment for segment in segments if segment.text)
        self._text += text
        answer_at = self._answer_at
        if answer_at is None:
            answer_at = self._answer_at = self._answer_start()
            if answer_at is None:
                # Reasoning, or what may still open it: shown as it comes, never parsed.
                return self._show(len(self._text)), False
            text = self._text[answer_at:]
        self._calls.add(self._parser.feed(text))
        spans = [(start + answer_at, end + answer_at) for start, end in self._parser.call_spans]
        while self._judged < len(spans):
            index = self._judged
            self._judged += 1
            if self._repeats_an_earlier_call(index):
                self.repeated_call = index
                start, end = spans[index]
                # Nothing of the repeat has gone out (it was held back): the reply ends
                # where it begins. Should a differently spaced copy have gone out in
                # part, it goes out whole: a call is never cut in two.
                cut = start if start >= self._shown else end
                return self._show(cut), True
        return self._show(self._safe_end(answer_at)), False

    def _answer_start(self) -> int | None:
        """Where the answer begins in the text so far; None while it may be reasoning.

        As the reasoning splitter reads it: reasoning opens the reply (its start tag
        after whitespace, or the prompt opened it) and ends at the end tag.
        """
        marks = self._reasoning
        assert marks is not None
        text = self._text
        if not marks.starts_inside:
            opening = text.lstrip()
            if not opening.startswith(marks.start):
                return None if marks.start.startswith(opening) else 0
        end = text.find(marks.end)
        return None if end < 0 else end + len(marks.end)

    def flush(self) -> list[TextSegment]:
        """Release held text at the end of generation (no repeat followed)."""
        held, self._held = self._held, []
        self._shown = len(self._text)
        return held

    def _safe_end(self, answer_at: int) -> int:
        """How far the text may be shown: up to where a possible repeat begins."""
        parser = self._parser
        text = self._text
        # Text the parser has not decided yet may begin a call (``<tool_`` ...).
        safe = parser.decided
        since = parser.call_since
        if since is not None and parser.call_spans:
            # Only the call being written is sliced, not the whole answer, each round.
            written = text[answer_at + since :]
            if any(
                len(written) <= end - start and text.startswith(written, answer_at + start)
                for start, end in parser.call_spans
            ):
                safe = min(safe, since)
        return max(answer_at + safe, self._shown)

    def _show(self, end: int) -> list[TextSegment]:
        count = max(0, end - self._shown)
        shown = take_chars(self._held, count)
        self._held = drop_chars(self._held, count)
        self._shown += count
        return shown

    def _repeats_an_earlier_call(self, index: int) -> bool:
        calls = self._calls.tool_calls or []
        if index >= len(calls):
            return False
        call = calls[index]
        value = _arguments_value(call.arguments)
        return any(
            earlier.name == call.name and _arguments_value(earlier.arguments) == value
            for earlier in calls[:index]
        )


def _arguments_value(arguments: str) -> Any:
    """A call's arguments as a JSON value (so spacing and key order do not matter)."""
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return arguments.strip()
