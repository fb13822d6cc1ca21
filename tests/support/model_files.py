"""Finding the real model files the slow tests use.

They come from the persistent test store (``draftpen models pull starter`` and
``smollm2``, done by packaging/test.sh). When ``DRAFTPEN_REQUIRE_MODELS=1`` (CI) a
missing model fails the test; otherwise it is skipped with the command to run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.models.catalog_file import load_catalog
from app.models.store import ModelStore

TARGET_KEY = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT_KEY = "qwen2.5-coder-0.5b-instruct-q5_0"
SMOLLM2_KEY = "smollm2-135m-instruct-q4_1"
PAIR_OF = {TARGET_KEY: "starter", DRAFT_KEY: "starter", SMOLLM2_KEY: "smollm2"}
# The catalog's MLX models of the same weights (their gguf_conversion sources).
MLX_OF = {
    TARGET_KEY: "qwen2.5-coder-1.5b-instruct-mlx",
    DRAFT_KEY: "qwen2.5-coder-0.5b-instruct-mlx",
    SMOLLM2_KEY: "smollm2-135m-instruct-mlx",
}
PAIR_OF.update({MLX_OF[key]: pair for key, pair in list(PAIR_OF.items())})


def models_dir() -> Path:
    """The persistent store the real-model tests read."""
    configured = os.environ.get("DRAFTPEN_MODELS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "draftpen-test-models"


def require_model(key: str, runtime: str = "llamacpp") -> Path:
    """The verified path of a catalog model, or fail/skip saying how to get it."""
    entry = load_catalog().model(key)
    path = ModelStore(models_dir()).path_if_verified(entry)
    if path is None:
        message = (
            f"model {key} is not in {models_dir()}; run: "
            f"DRAFTPEN_MODELS_DIR={models_dir()} draftpen models pull {PAIR_OF[key]} "
            f"--runtime {runtime}"
        )
        if os.environ.get("DRAFTPEN_REQUIRE_MODELS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def require_mlx_model(key: str) -> Path:
    """The MLX model of the same weights as the GGUF model ``key``, or fail/skip.

    Skips where mlx is not installed (packaging/test.sh installs it on Linux and macOS).
    The store gets it from ``draftpen models pull PAIR --runtime mlx`` (a GGUF
    conversion here, where the hub is unreachable), as packaging/test.sh does.
    """
    pytest.importorskip("mlx_lm", reason="mlx and mlx-lm are not installed")
    return require_model(MLX_OF[key], runtime="mlx")


# A 2-layer llama small enough to write in a test (random weights; SmolLM2's tokenizer
# and vocabulary, so the tests copy its tokenizer files beside it): its MLX config.
TINY_MLX_LLAMA: dict[str, object] = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
