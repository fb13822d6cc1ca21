"""What a reply must look like, as a request asks: the intent a grammar is built from.

The server turns ``response_format`` and ``tools`` / ``tool_choice`` into a
:class:`ConstraintSpec` and hands it to the engine in ``GenerationRequest.constraint``.
It is data only: no grammar is built here. Constrained decoding (llguidance, a token
mask applied to the target's p and the draft's q alike) reads it to build the grammar;
until then the loop generates as if there were none, and the replies are parsed as the
model wrote them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from backends.base import ToolSpec
from backends.output.call_syntax import ToolCallSyntax


@dataclass(frozen=True)
class JsonOutput:
    """The reply's text must be JSON: matching ``schema``, or any object when it is None."""

    schema: Mapping[str, Any] | None = None
    # OpenAI's strict mode: the schema is followed exactly (no extra keys where the
    # schema does not allow them); without it a schema is a strong hint.
    strict: bool = False
    name: str | None = None


@dataclass(frozen=True)
class ToolCallOutput:
    """The reply may (``auto``) or must (``required``) be calls to ``tools``.

    ``tools`` are the functions allowed (just one for a named ``tool_choice``);
    ``syntax`` is how this model writes a call (its wrapper text and argument key), so
    the grammar can spell the wrapper and hold each call's arguments to its
    function's ``parameters`` schema. With ``parallel`` false, at most one call.
    """

    tools: tuple[ToolSpec, ...]
    syntax: ToolCallSyntax
    mode: Literal["auto", "required"] = "auto"
    parallel: bool = True


@dataclass(frozen=True)
class ConstraintSpec:
    """Everything a request asks of the reply's form; either part may be absent.

    Both together (tools with ``auto`` and a JSON ``response_format``) mean: tool calls,
    or else text that is that JSON.
    """

    text: JsonOutput | None = None
    tool_calls: ToolCallOutput | None = None

    @property
    def is_empty(self) -> bool:
        """Whether nothing is asked (plain generation)."""
        return self.text is None and self.tool_calls is None
