"""What only the MLX runtime does: refusing caches it cannot roll back, bad token ids.

Uses a tiny random-weight model built here (with SmolLM2's converted tokenizer), so
these run in seconds; the shared behaviour is in test_runtime_conformance.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from backends.errors import DecodeError, ModelLoadError
from tests.model_files import SMOLLM2_KEY, require_mlx_model

pytestmark = pytest.mark.real_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _tiny_llama(directory: Path, *, layer_types: list[str]) -> Path:
    """A 2-layer llama with random weights and SmolLM2's tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    source = require_mlx_model(SMOLLM2_KEY)
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "layer_types": layer_types,
        "sliding_window": 8,
    }
    directory.mkdir()
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.save_safetensors(
        str(directory / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    (directory / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, directory / name)
    return directory


def test_sliding_window_models_are_refused_saying_why(tmp_path: Path):
    pytest.importorskip("mlx_lm")
    from backends.mlx_lm_backend import MlxModel

    directory = _tiny_llama(
        tmp_path / "sliding", layer_types=["sliding_attention", "full_attention"]
    )
    with pytest.raises(
        ModelLoadError, match=r"1 of its 2 layers use a sliding-window cache.*--runtime llamacpp"
    ):
        MlxModel(directory, n_ctx=64)


def test_a_full_attention_model_loads_and_rejects_out_of_range_tokens(tmp_path: Path):
    pytest.importorskip("mlx_lm")
    from backends.mlx_lm_backend import MlxModel

    model = MlxModel(_tiny_llama(tmp_path / "full", layer_types=["full_attention"] * 2), n_ctx=64)
    assert model.forward([1, 2, 3]).shape == (3, 49152)
    with pytest.raises(DecodeError, match="token ids must lie in"):
        model.forward([49152])
    assert list(model.cached_tokens) == [1, 2, 3]
    model.close()
