"""What a local MLX model directory says about itself, read from its ``config.json``.

On MLX a model is its Hugging Face directory: ``config.json`` beside one or more
``*.safetensors`` (and the tokenizer's files). Reading the config takes a millisecond and
needs no mlx, so ``--target``/``--draft`` and ``draftpen models add`` can classify a
directory on any machine before anything loads: a model (its architecture is the
config's ``model_type``), or an EAGLE-3, DFlash or DSpark head trained for a target
(:func:`backends.mlx.head_files.head_kind`, which imports no mlx either).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import DraftpenError
from backends.errors import ModelLoadError
from backends.mlx.head_files import head_kind

GIVE_ONE = "Give the model's MLX directory (config.json and *.safetensors) or a .gguf file."


class NotMlxDirectoryError(DraftpenError):
    """A directory given as a model that is not an MLX model (no config or no weights)."""


@dataclass(frozen=True)
class MlxDirectory:
    """An MLX model's directory: its config, what it is, and its weights' size."""

    path: Path
    config: dict[str, Any]
    head: str | None
    """``"eagle3"``, ``"dflash"`` or ``"dspark"`` for a head; ``None`` for a model."""
    size_bytes: int

    @property
    def architecture(self) -> str:
        """The config's ``model_type`` (a head's kind for a head), e.g. ``qwen3``."""
        if self.head is not None:
            return self.head
        text = self.config.get("text_config")
        nested = text.get("model_type") if isinstance(text, dict) else None
        return str(self.config.get("model_type") or nested or "unknown")

    @property
    def vocab_size(self) -> int | None:
        """The vocabulary the config declares (an EAGLE-3 head's: its target's), if any."""
        for table in (
            self.config.get("transformer_layer_config"),  # an EAGLE-3 head (speculators)
            self.config,
            self.config.get("text_config"),  # a vision-language model's language part
        ):
            value = table.get("vocab_size") if isinstance(table, dict) else None
            if isinstance(value, int) and value > 0:
                return value
        return None


def read_mlx_directory(path: Path) -> MlxDirectory:
    """The MLX model or head in ``path``; raises naming the fix when it is neither."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise NotMlxDirectoryError(
            f"{path} is a directory without config.json, so it is not an MLX model. {GIVE_ONE}"
        )
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise NotMlxDirectoryError(
            f"{path} has a config.json but no *.safetensors: its weights are missing "
            f"(still downloading?). {GIVE_ONE}"
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as error:
        raise NotMlxDirectoryError(
            f"{config_file} cannot be read as JSON ({error}). Download the model again."
        ) from error
    if not isinstance(config, dict):
        raise NotMlxDirectoryError(f"{config_file} is not a JSON object. {GIVE_ONE}")
    return MlxDirectory(
        path=path,
        config=config,
        head=_head_of(path),
        size_bytes=max(sum(weight.stat().st_size for weight in weights), 1),
    )


def _head_of(path: Path) -> str | None:
    try:
        return head_kind(path)
    except ModelLoadError:
        return None  # a config that names no head: a model that runs alone


def is_complete(path: Path) -> bool:
    """Whether ``path`` still holds an MLX model: its config.json and some safetensors."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))
