"""A closed llama.cpp model refuses work with an error instead of crashing the process."""

from __future__ import annotations

import pytest

from backends.errors import DecodeError
from backends.llamacpp.model import LlamaCppModel
from tests.support.model_files import require_model

pytestmark = pytest.mark.real_model


def test_forward_after_close_raises_instead_of_crashing() -> None:
    model = LlamaCppModel(require_model("smollm2-135m-instruct-q4_1"), n_ctx=256)
    tokens = model.tokenize("Hello", add_special=True)
    model.forward(tokens)
    model.close()
    with pytest.raises(DecodeError, match="was closed"):
        model.forward(tokens[:1])
    with pytest.raises(DecodeError, match="was closed"):
        model.prefill(tokens)
