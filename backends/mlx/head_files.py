"""Loading an EAGLE-3 or DFlash head for an MLX target, through mlx-vlm.

On MLX a head is its publisher's Hugging Face directory (``config.json`` and
safetensors: RedHatAI's EAGLE-3 speculators, z-lab's DFlash heads), the format mlx-vlm
reads. mlx-vlm's drafter loader builds its model class for the head (its config,
weights, quantization); draftpen then checks the head against the target it is to draft
for, and refuses, saying why, one trained for another target (hidden size, vocabulary,
layers) or one whose attention this runtime cannot roll back.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.errors import BackendError, ModelLoadError, RuntimeUnavailableError

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# What each kind of head is called in messages.
HEAD_NAMES = {"eagle3": "an EAGLE-3 head", "dflash": "a DFlash head", "dspark": "a DSpark head"}
INSTALL_MLX_VLM = (
    "MLX drafts with EAGLE-3 and DFlash heads through mlx-vlm, which is not installed: "
    "run packaging/install.sh again, or `pip install mlx-vlm` in draftpen's environment"
)


@dataclass(frozen=True)
class TargetShape:
    """What a head must match in its target."""

    name: str
    hidden_size: int
    n_vocab: int
    n_layers: int


@dataclass(frozen=True)
class LoadedHead:
    """A head's mlx-vlm model, what kind it is, and the target layers it reads."""

    model: Any
    kind: str  # "eagle3", "dflash" or "dspark"
    capture_layer_ids: tuple[int, ...]


def mlx_vlm_missing() -> str | None:
    """Why mlx-vlm's drafters cannot be imported here (None: they can)."""
    try:
        import mlx_vlm.speculative.drafters  # noqa: F401
    except ImportError:
        return INSTALL_MLX_VLM
    return None


def head_kind(path: Path) -> str:
    """ "eagle3", "dflash" or "dspark", from the head's ``config.json``."""
    config = _read_config(path)
    model_type = str(config.get("model_type") or config.get("speculators_model_type") or "")
    if "eagle3" in model_type:
        return "eagle3"
    if "dspark" in model_type or "dspark_config" in config:
        return "dspark"
    if "dflash_config" in config or "dflash" in model_type:
        return "dflash"
    raise ModelLoadError(
        f"{path} is not an EAGLE-3, DFlash or DSpark head (its config.json says "
        f"model_type {model_type or 'nothing'!r}). Give the head's Hugging Face directory."
    )


def load_head(path: Path, wanted: str, target: TargetShape) -> LoadedHead:
    """The head in directory ``path`` for ``target``; ``wanted`` is "eagle3", or "dflash"
    for a DFlash or DSpark head. Raises with the reason for one it cannot draft with."""
    kind = head_kind(path)
    if (wanted == "eagle3") != (kind == "eagle3"):
        raise BackendError(
            f"{path.name} is {HEAD_NAMES[kind]}, not {HEAD_NAMES[wanted]}: use --drafter {kind}"
        )
    if kind == "dspark":
        raise BackendError(
            f"{path.name} is a DSpark head: on MLX draftpen drafts with EAGLE-3 and DFlash "
            "heads (llama.cpp runs DSpark). Use --runtime llamacpp, or --drafter ngram."
        )
    missing = mlx_vlm_missing()
    if missing is not None:
        raise RuntimeUnavailableError(missing)
    from mlx_vlm.speculative.drafters import load_drafter
    from mlx_vlm.speculative.utils import speculative_prefill_kwargs

    try:
        model, _ = load_drafter(str(path), kind="eagle3" if kind == "eagle3" else "dflash")
    except (FileNotFoundError, ValueError, KeyError, OSError) as error:
        raise ModelLoadError(
            f"mlx-vlm could not load the head in {path} ({error}). Download it again."
        ) from error
    layers = speculative_prefill_kwargs(kind, model)["capture_layer_ids"]
    _check_fits(path, kind, model.config, tuple(int(layer) for layer in layers), target)
    return LoadedHead(model, kind, tuple(int(layer) for layer in layers))


def _check_fits(
    path: Path, kind: str, config: Any, layers: tuple[int, ...], target: TargetShape
) -> None:
    """Refuse a head trained for another target, or one this runtime cannot roll back."""
    if kind == "eagle3":
        text = config.transformer_layer_config
        hidden, vocab = int(config.target_hidden_size), int(text.vocab_size)
    else:
        hidden, vocab = int(config.hidden_size), int(config.vocab_size)
        sliding = "sliding_attention" in (config.layer_types or [])
        if sliding or getattr(config, "draft_window_size", None):
            raise BackendError(
                f"{path.name}'s attention reads a sliding window, which this runtime "
                "cannot roll back with the target. Use --drafter ngram or none."
            )
    problems = []
    if hidden != target.hidden_size:
        problems.append(f"hidden size {hidden}, the target's is {target.hidden_size}")
    if vocab != target.n_vocab:
        problems.append(f"vocabulary of {vocab} tokens, the target's has {target.n_vocab}")
    outside = [layer for layer in layers if not 0 <= layer < target.n_layers]
    if outside:
        problems.append(f"it reads layers {outside}, the target has {target.n_layers}")
    if problems:
        raise BackendError(
            f"{path.name} was trained for another target than {target.name}: "
            f"{'; '.join(problems)}. Use the head published for this model."
        )


def _read_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(
            f"{path} is not a head for MLX: it has no config.json. On MLX a head is its "
            "Hugging Face directory (config.json and safetensors), not a GGUF."
        )
    try:
        return dict(json.loads(config_file.read_text(encoding="utf-8")))
    except (ValueError, OSError) as error:
        message = f"{config_file} cannot be read ({error}); download the head again"
        raise ModelLoadError(message) from error
