"""Which drafters the MLX runtime runs: a draft model and n-grams; no draft heads.

The engine drafts with a head where the target model offers a way to attach one
(``mtp_head``, ``attach_eagle3_file`` on the llama.cpp model). :class:`MlxModel` offers
none: mlx-lm's speculative decoding takes a draft model only, and mlx-vlm's EAGLE-3 and
DFlash drafters run inside mlx-vlm's own models and loop (docs/speculation.md says what
using them would take). This is read from the model class, so the answer changes the day
it gains such a method.
"""

from __future__ import annotations

from importlib import metadata

from backends.mlx.model import MlxModel

DRAFTERS = ("model", "ngram", "mtp", "eagle3", "dflash", "dspark")
"""Every drafter a pair may name, in the order doctor lists them."""

# The method a target model offers for each head (the engine looks for the same ones).
_HEAD_ENTRY_POINTS = {
    "mtp": "mtp_head",
    "eagle3": "attach_eagle3_file",
    "dflash": "attach_dflash_file",
    "dspark": "attach_dflash_file",
}


def drafter_support() -> dict[str, str | None]:
    """Each drafter of :data:`DRAFTERS`, with why MLX cannot run it here (None: it can)."""
    try:
        mlx_lm = f"mlx-lm {metadata.version('mlx-lm')}"
    except metadata.PackageNotFoundError:  # pragma: no cover - MlxModel needs mlx-lm
        mlx_lm = "mlx-lm"
    # One reason for every head, so doctor says it once.
    no_head = (
        f"draftpen's MLX runtime attaches no draft head ({mlx_lm} drafts with a draft model "
        "only); a head pair's MLX variant drafts with n-grams"
    )
    support: dict[str, str | None] = {"model": None, "ngram": None}
    for name, entry_point in _HEAD_ENTRY_POINTS.items():
        support[name] = None if hasattr(MlxModel, entry_point) else no_head
    return support
