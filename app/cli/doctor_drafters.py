"""The drafters each runtime runs here, as ``draftpen doctor`` shows them.

llama.cpp's answer comes from the runtime check's child, which asks the library which
head functions it exports (``backends.llamacpp.drafter_support``); MLX's from its model
class and whether mlx-vlm's head models import (``backends.mlx.drafter_support``), read
in doctor's own process as doctor reads the MLX device. Each answer maps a drafter to
why it cannot run (None: it runs).
"""

from __future__ import annotations

from typing import Any

from backends.select import RuntimeFacts

DrafterSupport = dict[str, str | None]


def mlx_drafters(facts: RuntimeFacts) -> DrafterSupport | None:
    """The MLX runtime's drafters; None where mlx is not installed or does not load."""
    if not facts.mlx_version:
        return None
    try:
        from backends.mlx.drafter_support import drafter_support

        return drafter_support()
    except Exception:  # as doctor's MLX device check: a broken install is not doctor's crash
        return None


def drafter_lines(llamacpp: DrafterSupport | None, mlx: DrafterSupport | None) -> list[str]:
    """``drafters (llama.cpp): model, ngram, ...`` and, indented, what does not run and why."""
    lines: list[str] = []
    for label, support in (("llama.cpp", llamacpp), ("mlx", mlx)):
        if support is None:
            continue
        runs = [name for name, reason in support.items() if reason is None]
        lines.append(f"drafters ({label}): {', '.join(runs) or 'none'}")
        # One line per reason, naming every drafter it keeps out.
        reasons: dict[str, list[str]] = {}
        for name, reason in support.items():
            if reason is not None:
                reasons.setdefault(reason, []).append(name)
        lines += [f"  not {', '.join(names)}: {reason}" for reason, names in reasons.items()]
    return lines


def drafters_json(llamacpp: DrafterSupport | None, mlx: DrafterSupport | None) -> dict[str, Any]:
    """The same as data: per runtime, each drafter's ``runs`` and ``why_not`` (None where
    that runtime is not here)."""

    def entries(support: DrafterSupport | None) -> dict[str, Any] | None:
        if support is None:
            return None
        return {
            name: {"runs": reason is None, "why_not": reason} for name, reason in support.items()
        }

    return {"llamacpp": entries(llamacpp), "mlx": entries(mlx)}
