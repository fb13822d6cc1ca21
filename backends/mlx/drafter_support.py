"""Which drafters the MLX runtime runs here: a draft model, n-grams, and the heads
:class:`MlxModel` attaches (EAGLE-3 and DFlash, through mlx-vlm), where mlx-vlm imports.

The engine drafts with a head where the target model offers a way to attach one
(``mtp_head``, ``attach_eagle3_file``, ``attach_dflash_file``); the answer is read from
the model class and from mlx-vlm's import (``head_files.mlx_vlm_missing``), so it
changes the day either does. A DSpark head is refused by the head loader itself
(``head_files.load_head``), so it is named here with the loader's reason.
"""

from __future__ import annotations

from backends.mlx.head_files import mlx_vlm_missing
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

# Each head in prose, for the reasons.
_HEAD_LABELS = {"mtp": "MTP", "eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark"}

# Heads whose file the MLX head loader refuses although the entry point exists: a DSpark
# head comes in through attach_dflash_file, and load_head says no to it.
_LOADER_REFUSES = {
    "dspark": "draftpen's MLX runtime drafts with EAGLE-3 and DFlash heads, not DSpark "
    "heads; llama.cpp runs them",
}


def drafter_support() -> dict[str, str | None]:
    """Each drafter of :data:`DRAFTERS`, with why MLX cannot run it here (None: it can)."""
    support: dict[str, str | None] = {"model": None, "ngram": None}
    missing = mlx_vlm_missing()
    for name, entry_point in _HEAD_ENTRY_POINTS.items():
        if not hasattr(MlxModel, entry_point):
            support[name] = (
                f"draftpen's MLX runtime attaches no {_HEAD_LABELS[name]} head; llama.cpp runs it"
            )
        elif name in _LOADER_REFUSES:
            support[name] = _LOADER_REFUSES[name]
        else:
            support[name] = missing  # None where mlx-vlm's head models import
    return support
