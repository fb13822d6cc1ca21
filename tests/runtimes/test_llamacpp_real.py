"""What only the llama.cpp runtime does: reading GGUF files, and refusing bad ones.

The behaviour every runtime shares (forward/rollback, greedy speculative == plain,
stop strings, pair checks) is in test_runtime_conformance.py, run on both runtimes.
These load real GGUF files (marked ``real_model``); they run in CI.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.errors import ModelLoadError
from backends.llamacpp.model import LlamaCppModel
from tests.support.model_files import SMOLLM2_KEY, TARGET_KEY, require_model

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def smollm2() -> Iterator[LlamaCppModel]:
    model = LlamaCppModel(require_model(SMOLLM2_KEY), n_ctx=256)
    yield model
    model.close()


def test_chat_template_comes_from_the_gguf_metadata():
    model = LlamaCppModel(require_model(TARGET_KEY), n_ctx=256)
    try:
        assert model.chat_template and "im_start" in model.chat_template
    finally:
        model.close()


def test_truncated_gguf_is_refused_with_a_clear_message(tmp_path, smollm2: LlamaCppModel):
    truncated = tmp_path / "truncated.gguf"
    with smollm2.path.open("rb") as source:
        truncated.write_bytes(source.read(5_000_000))
    with pytest.raises(ModelLoadError, match="truncated or corrupt") as refused:
        LlamaCppModel(truncated, n_ctx=256)
    # What llama.cpp said at its error level is in the message (its errors were dropped
    # once, keeping its info lines: "no details from llama.cpp").
    assert "failed to load model" in str(refused.value)


def test_non_gguf_file_is_refused(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_text("<html>404 not found</html>")
    with pytest.raises(ModelLoadError, match="not a GGUF model file"):
        LlamaCppModel(bogus)
