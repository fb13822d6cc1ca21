"""Tiny random-weight Qwen3.5 models (Gated DeltaNet + attention) built with mlx-lm's own
``qwen3_5`` class and SmolLM2's tokenizer: a target and a perturbed draft, written once
per module (the ``tiny_dirs`` fixture).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.support.model_files import SMOLLM2_KEY, require_mlx_model

N_VOCAB = 49152  # SmolLM2's
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
CONFIG = {
    "model_type": "qwen3_5",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": N_VOCAB,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "tie_word_embeddings": False,
    "rope_parameters": {"type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.5},
}
# The tokens a random model mostly writes: SmolLM2's ids from 300 on are common word
# pieces (as tests/support/tiny_hybrid.py does for llama.cpp).
FAVOURED_FIRST, FAVOURED_TOKENS = 300, 64


def tiny_qwen35_weights(seed: int) -> dict[str, np.ndarray]:
    """mlx-lm's Qwen3.5 model, initialised from ``seed``, as numpy arrays by name.

    The embeddings are large enough that the logits are peaked; the untied output
    layer has large rows for a few ordinary tokens, so the model's output falls into
    loosely repeating stretches that n-gram drafts can follow.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_5

    mx.random.seed(seed)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(CONFIG))
    weights = {name: np.array(value) for name, value in tree_flatten(model.parameters())}
    rng = np.random.default_rng(seed)
    embed = "language_model.model.embed_tokens.weight"
    weights[embed] = (rng.standard_normal(weights[embed].shape) * 0.5).astype(np.float32)
    head = (rng.standard_normal((N_VOCAB, CONFIG["hidden_size"])) * 0.05).astype(np.float32)
    favoured = slice(FAVOURED_FIRST, FAVOURED_FIRST + FAVOURED_TOKENS)
    head[favoured] = (rng.standard_normal(head[favoured].shape) * 0.5).astype(np.float32)
    weights["language_model.lm_head.weight"] = head
    return weights


def perturbed(weights: dict[str, np.ndarray], *, seed: int, scale: float) -> dict[str, np.ndarray]:
    """The same weights with relative noise: a draft that agrees with its target often."""
    rng = np.random.default_rng(seed)
    changed = {}
    for name, values in weights.items():
        noise = rng.standard_normal(values.shape).astype(np.float32)
        changed[name] = values + scale * float(np.std(values) or 0.0) * noise
    return changed


def write_model(directory: Path, weights: dict[str, np.ndarray]) -> Path:
    """An mlx-lm model directory: the weights, config.json and SmolLM2's tokenizer."""
    import mlx.core as mx

    tokenizer = require_mlx_model(SMOLLM2_KEY)
    directory.mkdir()
    arrays = {name: mx.array(values) for name, values in weights.items()}
    mx.save_safetensors(str(directory / "model.safetensors"), arrays)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer / name, directory / name)
    return directory


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny hybrid target and its draft (the same weights with noise)."""
    pytest.importorskip("mlx_lm")
    folder = tmp_path_factory.mktemp("tiny-mlx-hybrid")
    weights = tiny_qwen35_weights(seed=1)
    target = write_model(folder / "target", weights)
    draft = write_model(folder / "draft", perturbed(weights, seed=7, scale=0.1))
    return target, draft
