"""``draftpen bench --engine``: the same suite, asked of the running engine.

Each generation is a chat request over the engine's socket (``app.client``), with the
mode's drafter in ``speculative``, a schema as ``response_format`` and tools with
``tool_choice: "required"``: the grammar the in-process run compiles itself. The
figures are the loop's own, as the stream's ``draftpen`` statistics carry them, so
they sum into the same :class:`~app.bench.modes.ModeTotals`. What the engine's process
costs the loop (its event loop, the stream) is in them; the client's reading is not.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from app.bench.modes import BenchMode, ModeTotals
from app.bench.suite import BenchPrompt
from app.client import ChatTurn, EngineClient, Loading, Waiting
from app.errors import DraftpenError
from backends.base import ChatMessage
from backends.generation_events import GenerationEvent
from backends.sampling.filters import SamplingParams


class EngineDecoder:
    """Bench's generations, run by the engine on ``client``'s socket with ``pair``."""

    def __init__(self, client: EngineClient, pair: str) -> None:
        self.client = client
        self.pair = pair
        # Requests that had to wait in the engine's queue (another client was served).
        self.waited = 0

    def prompt_tokens(self, prompt: BenchPrompt) -> Sequence[int] | None:
        """None: the prompt is read by the engine, so no yardstick runs beside it."""
        return None

    def decode(
        self, prompt: BenchPrompt, mode: BenchMode, params: SamplingParams, max_tokens: int
    ) -> ModeTotals:
        """One generation in ``mode``, asked of the engine; its figures from the stream."""
        turn = ChatTurn(
            self.pair,
            (ChatMessage("user", prompt.text),),
            params,
            max_tokens=max_tokens,
            drafter=mode.drafter,
            draft_tokens=mode.draft_tokens,
            fit_context=False,
            exact=mode.exact,
            **({} if mode.ignore_constraint else constraint_fields(prompt)),
        )
        last: GenerationEvent | None = None
        waited = False
        for item in self.client.chat(turn):
            if isinstance(item, Waiting):
                waited = True
            elif isinstance(item, Loading):
                print(f"  the engine is loading {self.pair}: {item.text}", file=sys.stderr)
            else:
                last = item
        self.waited += waited
        if last is None or last.finish_reason is None:
            raise DraftpenError(f"The engine ended a bench request on {self.pair} unanswered.")
        return ModeTotals.of_stats(last.stats)


def constraint_fields(prompt: BenchPrompt) -> dict[str, Any]:
    """The request fields that make the engine decode ``prompt`` under its grammar."""
    if prompt.schema is not None:
        schema = {"name": "answer", "schema": prompt.schema, "strict": True}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    if prompt.tools:
        tools = tuple(
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    **({"description": tool.description} if tool.description else {}),
                    "parameters": tool.parameters,
                },
            }
            for tool in prompt.tools
        )
        return {"tools": tools, "tool_choice": "required", "parallel_tool_calls": False}
    return {}
