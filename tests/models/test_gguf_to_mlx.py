"""GGUF -> MLX conversion: tensor names, llama.cpp's rotary row order, atomic output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.models.sources.gguf_to_mlx import (
    FACTS_NAME,
    _hf_name,
    _unpermute_rotary,
    convert_gguf_to_mlx,
)
from tests.support.model_files import SMOLLM2_KEY, require_model


def _llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to llama Q/K rows (written out for the test)."""
    rows = weights.shape[0]
    grouped = weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
    return grouped.swapaxes(1, 2).reshape(weights.shape)


@pytest.mark.parametrize("shape", [(24, 5), (24,)])
def test_unpermute_restores_hugging_face_row_order(shape: tuple[int, ...]):
    original = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    permuted = _llama_cpp_permute(original, heads=3)
    assert not np.array_equal(permuted, original)
    np.testing.assert_array_equal(_unpermute_rotary(permuted, heads=3), original)


def test_tensor_names_map_to_mlx_lm_names():
    assert _hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert _hf_name("output.weight") == "lm_head.weight"
    assert _hf_name("blk.7.attn_q.bias") == "model.layers.7.self_attn.q_proj.bias"
    assert _hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert _hf_name("rope_freqs.weight") is None


@pytest.mark.real_model
def test_conversion_writes_config_tokenizer_and_facts(tmp_path: Path):
    pytest.importorskip("transformers")
    out = tmp_path / "smollm2"
    convert_gguf_to_mlx(require_model(SMOLLM2_KEY), out)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"]) == (576, 30)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["tie_word_embeddings"] is True
    facts = json.loads((out / FACTS_NAME).read_text())
    assert facts["vocab_type"] == "bpe" and facts["add_bos"] is False
    assert 2 in facts["end_of_generation_ids"]
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2"]  # no staging left behind


@pytest.mark.real_model
def test_a_failed_conversion_leaves_nothing_behind(tmp_path: Path):
    truncated = tmp_path / "truncated.gguf"
    with require_model(SMOLLM2_KEY).open("rb") as source:
        truncated.write_bytes(source.read(5_000_000))
    out = tmp_path / "models" / "smollm2"
    with pytest.raises(Exception):  # noqa: B017 - gguf's reader raises several kinds
        convert_gguf_to_mlx(truncated, out)
    assert not out.exists()
    leftovers = list((tmp_path / "models").iterdir()) if (tmp_path / "models").exists() else []
    assert leftovers == []
