"""Finding the real model files the slow tests use.

They come from the persistent test store (``draftpen models pull starter`` and
``smollm2``, done by packaging/test.sh). When ``DRAFTPEN_REQUIRE_MODELS=1`` (CI) a
missing model fails the test; otherwise it is skipped with the command to run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.catalog import load_catalog
from app.downloads import ModelStore

TARGET_KEY = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT_KEY = "qwen2.5-coder-0.5b-instruct-q5_0"
SMOLLM2_KEY = "smollm2-135m-instruct-q4_1"
PAIR_OF = {TARGET_KEY: "starter", DRAFT_KEY: "starter", SMOLLM2_KEY: "smollm2"}


def models_dir() -> Path:
    """The persistent store the real-model tests read."""
    configured = os.environ.get("DRAFTPEN_MODELS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "draftpen-test-models"


def require_model(key: str) -> Path:
    """The verified path of a catalog model, or fail/skip saying how to get it."""
    entry = load_catalog().model(key)
    path = ModelStore(models_dir()).path_if_verified(entry)
    if path is None:
        message = (
            f"model {key} is not in {models_dir()}; run: "
            f"DRAFTPEN_MODELS_DIR={models_dir()} draftpen models pull {PAIR_OF[key]}"
        )
        if os.environ.get("DRAFTPEN_REQUIRE_MODELS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def require_mlx_model(key: str) -> Path:
    """The MLX conversion of a catalog model (made by packaging/test.sh), or fail/skip.

    Skips when mlx is not installed here (it is installed for tests on Linux and
    macOS by packaging/test.sh).
    """
    pytest.importorskip("mlx_lm", reason="mlx and mlx-lm are not installed")
    from app.gguf_to_mlx import is_converted, mlx_directory_for

    directory = mlx_directory_for(require_model(key))
    if not is_converted(directory):
        message = (
            f"model {key} has no MLX conversion at {directory}; run: "
            f"python -m app.gguf_to_mlx {directory.with_suffix('.gguf')}"
        )
        if os.environ.get("DRAFTPEN_REQUIRE_MODELS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return directory
