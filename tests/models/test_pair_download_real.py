"""The tokenizer check after a download, on the real starter pair and SmolLM2.

Only the tokenizers are read (llama.cpp's vocab-only load), so this takes about a
second even though the files are real models.
"""

from __future__ import annotations

import pytest

from app.models.catalog_file import load_catalog
from app.models.pair_download import check_pair_tokenizers
from app.models.pair_files import ResolvedPair, resolve_pair
from app.models.store import ModelStore
from tests.conftest import TEST_MODELS_DIR
from tests.support.model_files import require_model

pytestmark = pytest.mark.real_model

TARGET_KEY = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT_KEY = "qwen2.5-coder-0.5b-instruct-q5_0"
SMOLLM2_KEY = "smollm2-135m-instruct-q4_1"


def test_the_starter_pair_passes_the_tokenizer_check_after_download() -> None:
    require_model(TARGET_KEY)
    require_model(DRAFT_KEY)
    resolved = resolve_pair(load_catalog(), "starter", ModelStore(TEST_MODELS_DIR), "llamacpp")
    verdict = check_pair_tokenizers(resolved)
    assert verdict is not None and verdict.compatible


def test_a_draft_with_another_tokenizer_fails_the_check_with_the_reason() -> None:
    require_model(TARGET_KEY)
    require_model(SMOLLM2_KEY)
    catalog = load_catalog()
    store = ModelStore(TEST_MODELS_DIR)
    starter = resolve_pair(catalog, "starter", store, "llamacpp")
    mismatched = ResolvedPair(
        target_path=starter.target_path,
        draft_path=store.path_for(catalog.model(SMOLLM2_KEY)),
        entry=starter.entry,
        runtime="llamacpp",
    )
    verdict = check_pair_tokenizers(mismatched)
    assert verdict is not None and not verdict.compatible
    assert "differ" in (verdict.problem or "")
