"""A long prompt made of this repository's own source, as an agent's files would be
(benchmarks/exact_cost.py, benchmarks/exact_kernels_phase.py)."""

from __future__ import annotations

from pathlib import Path

from backends.engine import Engine

REPO = Path(__file__).resolve().parent.parent


def source_tokens(engine: Engine, count: int) -> list[int]:
    """``count`` tokens of this repository's own source, as a long prompt would be."""
    source = "\n\n".join(path.read_text() for path in sorted((REPO / "backends").rglob("*.py")))
    tokens = engine.target.tokenize(source, add_special=False)
    while len(tokens) < count:
        tokens = tokens + tokens
    return tokens[:count]
