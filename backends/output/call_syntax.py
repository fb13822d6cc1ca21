"""Each model family's way of writing tool calls, and which one a chat template teaches.

Models write tool calls in their family's own syntax, the one their chat template
teaches them:

- Hermes, Qwen2.5, Qwen3: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call. Small Qwen2.5-Coder models often leave the tags out: they write
  the object in a fenced ```` ```json ```` block, or bare at the start of the reply,
  and doubled as ``{{...}}`` (Qwen2.5's template shows the format that way). Those
  forms are also ordinary text, so they count as a call only when they name one of
  the request's tools.
- Llama 3.1 and later: a bare JSON object ``{"name": ..., "parameters": {...}}`` that
  begins the reply, after ``<|python_tag|>`` or not; several are separated by ``;``.

The family is chosen from the template text (:func:`tool_call_syntax`), never from a
pair's name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CallWrapper:
    """How one form of call is delimited around its JSON object.

    ``opener`` is the text that opens a call; an empty opener means a bare JSON object
    at the start of the reply. ``closer`` follows the object (empty: the object's end
    closes the call). ``known_names_only`` wrappers are also ordinary text (a fenced
    JSON block), so they make a call only when the name is one of the tools.
    """

    opener: str
    closer: str = ""
    known_names_only: bool = False


@dataclass(frozen=True)
class ToolCallSyntax:
    """A model family's way of writing tool calls."""

    family: str
    wrappers: tuple[CallWrapper, ...]
    # The key that holds the arguments, after "name" (both are read for every family).
    argument_keys: tuple[str, ...] = ("arguments", "parameters")
    # Text allowed between two calls besides whitespace.
    separators: str = ""
    # The wrapper the template itself teaches: what constrained decoding writes.
    canonical: int = 0

    @property
    def canonical_wrapper(self) -> CallWrapper:
        """The form of call a grammar spells out (the template's own)."""
        return self.wrappers[self.canonical]


HERMES = ToolCallSyntax(
    "hermes",
    (
        CallWrapper("<tool_call>", "</tool_call>"),
        CallWrapper("```json", "```", known_names_only=True),
        CallWrapper("", known_names_only=True),
    ),
)
LLAMA3_JSON = ToolCallSyntax(
    "llama3_json",
    (CallWrapper("<|python_tag|>"), CallWrapper("")),
    argument_keys=("parameters", "arguments"),
    separators=";",
    canonical=1,  # the bare JSON object; <|python_tag|> is for built-in tools
)


def tool_call_syntax(template: str | None) -> ToolCallSyntax | None:
    """The call syntax a chat template teaches, or None when it is not one we read."""
    if not template:
        return None
    if "<tool_call>" in template and "<function=" not in template:
        return HERMES
    if "<|python_tag|>" in template or (
        "<|start_header_id|>" in template and '"parameters"' in template
    ):
        return LLAMA3_JSON
    return None
