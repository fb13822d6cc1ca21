"""A tiny random-weight Llama for MLX (2 layers, or another's weights perturbed) with
SmolLM2's tokenizer, for the tests of several sequences at once on the MLX runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.model_files import TINY_MLX_LLAMA
from tests.support.tiny_mlx_heads import copy_smollm2_tokenizer

pytest.importorskip("mlx_lm")


def _tiny_llama(directory: Path, *, seed: int, like: Path | None = None) -> Path:
    """A 2-layer llama with random weights (or ``like``'s, perturbed) and SmolLM2's
    tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    config = dict(TINY_MLX_LLAMA)
    mx.random.seed(seed)
    if like is None:
        weights = dict(tree_flatten(llama.Model(llama.ModelArgs.from_dict(config)).parameters()))
    else:
        weights = mx.load(str(like / "model.safetensors"))
        weights = {
            name: value + 0.3 * mx.std(value) * mx.random.normal(value.shape)
            for name, value in weights.items()
        }
    directory.mkdir()
    # Stored in float16 as published models are: loading converts them to float32 on
    # the loading thread, which the runtime thread must not have to finish.
    weights = {name: value.astype(mx.float16) for name, value in weights.items()}
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    (directory / "config.json").write_text(json.dumps(config))
    copy_smollm2_tokenizer(directory)
    return directory
