"""Where a streaming reply's finished Markdown ends and its live tail begins (no UI).

Rendering Markdown is the chat app's most expensive drawing: re-parsing and re-laying
out the whole reply several times a second takes CPU that decoding needs. So the
message view renders a block only once it is complete, and shows the unfinished tail
as plain (or tinted) text. A block is complete when a blank line follows it outside a
code fence, or when its closing fence line has ended.
"""

from __future__ import annotations

import re

# A fence opens with ``` or ~~~ (three or more), indented at most three spaces.
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def completed_length(text: str, start: int = 0) -> int:
    """How many leading characters of ``text`` form complete Markdown blocks.

    Only whole lines count. Outside a fence a blank line ends the blocks before it;
    a fence's closing line ends the fenced block (``text[:n]`` then ends with it).
    ``start``: an earlier answer for a prefix of ``text`` (a block boundary, so never
    inside a fence); the scan resumes there instead of reading the reply again.
    """
    completed = start
    position = start
    fence: str | None = None  # the opening marker while inside a fenced block
    while True:
        newline = text.find("\n", position)
        if newline < 0:
            return completed
        line = text[position:newline]
        position = newline + 1
        match = _FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
            elif not line.strip():
                completed = position
        elif (
            match
            and match.group(1)[0] == fence[0]
            and len(match.group(1)) >= len(fence)
            and not line[match.end() :].strip()  # a closing fence carries no info string
        ):
            fence = None
            completed = position


def split_segments(
    segments: list[tuple[str, bool]], offset: int
) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
    """``segments`` (text, from_draft) cut at character ``offset`` of their joined text."""
    head: list[tuple[str, bool]] = []
    tail: list[tuple[str, bool]] = []
    seen = 0
    for text, from_draft in segments:
        if seen >= offset:
            tail.append((text, from_draft))
        elif seen + len(text) <= offset:
            head.append((text, from_draft))
        else:
            cut = offset - seen
            head.append((text[:cut], from_draft))
            tail.append((text[cut:], from_draft))
        seen += len(text)
    return head, tail
