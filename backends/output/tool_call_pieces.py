"""What :class:`~backends.output.tool_calls.ToolCallParser` makes of a streamed reply: pieces of
content, the start of a call and fragments of its arguments, and the reply they add up
to. The dialects' streaming answers turn each piece into their own chunk shape."""

from __future__ import annotations

import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass

from backends.base import ToolCall

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A call id in OpenAI's form: ``call_`` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ContentPiece:
    """Reply text that is not a tool call."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A call began: its position among the reply's calls, its id and function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsPiece:
    """More of call ``index``'s arguments (JSON text; the pieces concatenate)."""

    index: int
    text: str


ParsedPiece = ContentPiece | ToolCallStart | ArgumentsPiece


@dataclass
class ParsedReply:
    """A reply's content and calls, put together from parsed pieces."""

    content: str = ""
    tool_calls: list[ToolCall] | None = None

    def add(self, pieces: Sequence[ParsedPiece]) -> None:
        """Add pieces in the order the parser returned them."""
        for piece in pieces:
            if isinstance(piece, ContentPiece):
                self.content += piece.text
            elif isinstance(piece, ToolCallStart):
                self.tool_calls = [*(self.tool_calls or []), ToolCall(piece.id, piece.name, "")]
            else:
                assert self.tool_calls is not None
                call = self.tool_calls[piece.index]
                self.tool_calls[piece.index] = ToolCall(
                    call.id, call.name, call.arguments + piece.text
                )
