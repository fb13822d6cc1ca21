"""The prompt suite bench runs: ``prompts.toml``, by category.

A prompt may carry a JSON ``schema`` its reply must follow, or ``tools`` it must call
one of: those prompts decode under a grammar (see :mod:`backends.output.constraints`).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from app.errors import DraftpenError
from backends.base import ChatMessage, ToolSpec
from backends.engine import Engine
from backends.output.call_syntax import tool_call_syntax
from backends.output.output_constraints import ConstraintSpec, JsonOutput, ToolCallOutput


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of the suite, with the form its reply must take, if any."""

    category: str
    text: str
    schema: dict[str, Any] | None = None
    tools: tuple[ToolSpec, ...] = ()

    @property
    def constrained(self) -> bool:
        """Whether the reply decodes under a grammar."""
        return self.schema is not None or bool(self.tools)

    def prompt_tokens(self, engine: Engine) -> tuple[int, ...]:
        """The prompt in the target's chat template (with the tools, if any)."""
        return tuple(engine.chat_prompt([ChatMessage("user", self.text)], tools=self.tools))

    def constraint(self, engine: Engine) -> ConstraintSpec | None:
        """The grammar's intent: the schema, or one call of the tools in the model's syntax."""
        if self.schema is not None:
            return ConstraintSpec(text=JsonOutput(self.schema, strict=True))
        if not self.tools:
            return None
        syntax = tool_call_syntax(getattr(engine.target, "chat_template", None))
        if syntax is None:
            raise DraftpenError(
                f"The {self.category!r} prompts need a model whose chat template takes tools; "
                f"{engine.target.name}'s does not. Leave out --category {self.category}."
            )
        return ConstraintSpec(
            tool_calls=ToolCallOutput(self.tools, syntax, mode="required", parallel=False)
        )


def load_prompt_suite(categories: list[str] | None = None) -> list[BenchPrompt]:
    """The prompt suite shipped with draftpen, optionally only some categories."""
    text = resources.files("app.bench").joinpath("prompts.toml").read_text(encoding="utf-8")
    prompts = [_prompt(entry) for entry in tomllib.loads(text)["prompts"]]
    if categories:
        known = {p.category for p in prompts}
        unknown = sorted(set(categories) - known)
        if unknown:
            raise DraftpenError(
                f"Unknown bench categories: {', '.join(unknown)}. "
                f"Known: {', '.join(sorted(known))}."
            )
        prompts = [p for p in prompts if p.category in categories]
    return prompts


def _prompt(entry: dict[str, Any]) -> BenchPrompt:
    schema = json.loads(entry["schema"]) if "schema" in entry else None
    tools = tuple(
        ToolSpec(tool["name"], tool.get("description"), tool["parameters"])
        for tool in json.loads(entry.get("tools", "[]"))
    )
    return BenchPrompt(entry["category"], entry["text"], schema, tools)
