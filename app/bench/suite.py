"""The prompt suite bench runs: ``prompts.toml``, by category."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from app.errors import DraftpenError


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of the suite."""

    category: str
    text: str


def load_prompt_suite(categories: list[str] | None = None) -> list[BenchPrompt]:
    """The prompt suite shipped with draftpen, optionally only some categories."""
    text = resources.files("app.bench").joinpath("prompts.toml").read_text(encoding="utf-8")
    prompts = [BenchPrompt(p["category"], p["text"]) for p in tomllib.loads(text)["prompts"]]
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
