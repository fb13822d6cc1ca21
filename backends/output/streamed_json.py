"""Reading a tool call's JSON from text that arrives in pieces.

What :class:`~backends.output.tool_calls.ToolCallParser` builds on: the head of a call
(``{"name": "...", "arguments":``, or not yet known, or not a call), and where one JSON
value ends while it is still being written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence


class Head:
    """Outcome of reading ``{"name": "...", "arguments":`` at the start of a call."""

    PENDING = "pending"
    MISMATCH = "mismatch"


WHITESPACE = " \t\r\n"


def _skip_whitespace(text: str, position: int) -> int:
    while position < len(text) and text[position] in WHITESPACE:
        position += 1
    return position


def _string_end(text: str, start: int) -> int | None:
    """The index after the JSON string opening at ``start``, None while unterminated."""
    position = start + 1
    while position < len(text):
        char = text[position]
        if char == "\\":
            position += 2
            continue
        if char == '"':
            return position + 1
        position += 1
    return None


def read_head(text: str, argument_keys: Sequence[str]) -> tuple[str, int, int] | str:
    """The function name, where its arguments begin and how many braces opened the call.

    Or PENDING (not enough text yet) or MISMATCH (not a call's head).
    """
    position = _skip_whitespace(text, 0)
    if position >= len(text):
        return Head.PENDING
    if text[position] != "{":
        return Head.MISMATCH
    position = _skip_whitespace(text, position + 1)
    if position >= len(text):
        return Head.PENDING
    braces = 1
    if text[position] == "{":
        braces, position = 2, position + 1
    expected: list[str | tuple[str, ...] | None] = [
        ("name",),
        ":",
        None,  # the name itself
        ",",
        tuple(argument_keys),
        ":",
    ]
    name = ""
    for step in expected:
        position = _skip_whitespace(text, position)
        if position >= len(text):
            return Head.PENDING
        if isinstance(step, str):
            if text[position] != step:
                return Head.MISMATCH
            position += 1
            continue
        if text[position] != '"':
            return Head.MISMATCH
        end = _string_end(text, position)
        if end is None:
            return Head.PENDING
        try:
            value = json.loads(text[position:end])
        except ValueError:
            return Head.MISMATCH
        if step is None:
            name = value
        elif value not in step:
            return Head.MISMATCH
        position = end
    return name, _skip_whitespace(text, position), braces


class JsonValueScanner:
    """Finds where one JSON value ends in text that arrives in pieces.

    It counts brackets outside strings; it does not check the JSON, it only has to
    know when the model has finished writing the value.
    """

    def __init__(self) -> None:
        self.started = False
        self.first_char = ""
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def end_in(self, text: str) -> int | None:
        """Feed ``text``; the index just after the value's end in it, or None."""
        for position, char in enumerate(text):
            if not self.started:
                if char in WHITESPACE:
                    continue
                self.started = True
                self.first_char = char
            elif self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
                    if self._depth == 0:
                        return position + 1
                continue
            if char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                if self._depth == 0:
                    return position  # a bare number or literal, ended by its container
                self._depth -= 1
                if self._depth == 0:
                    return position + 1
            elif self._depth == 0 and char != self.first_char and char in "," + WHITESPACE:
                return position  # a bare number or literal ended
        return None
