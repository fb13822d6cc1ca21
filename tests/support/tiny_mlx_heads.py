"""Tiny random-weight MLX targets (llama, qwen3) with EAGLE-3 and DFlash heads written for
them in their publishers' Hugging Face formats (speculators' EAGLE-3 config, z-lab's
DFlash config), which mlx-vlm's drafter loader reads, for the tests of heads on MLX.

The targets have four layers, so a head reads three distinct ones as the published
heads do; an EAGLE-3 head may have a vocabulary of its own, mapped to the target's by
``d2t`` as published heads' are. Random weights, but built to lean on the target (as
tests/support/tiny_eagle3.py's do), so that a head's q overlaps the target's p.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.support.model_files import SMOLLM2_KEY, require_mlx_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
HIDDEN = 64
VOCAB = 49152
DFLASH_BLOCK = 8
# SmolLM2's tokenizer: an id the prompts never produce, as a DFlash mask token.
DFLASH_MASK_TOKEN = 49151


def target_config(
    arch: str = "llama", hidden: int = HIDDEN, *, tied: bool = False
) -> dict[str, object]:
    """A four-layer target's mlx-lm config."""
    config: dict[str, object] = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": VOCAB,
        # An output layer of its own: a tied random one maps a token's state back to
        # the token itself, and greedy replies would repeat one token.
        "tie_word_embeddings": tied,
    }
    if arch == "qwen3":
        config.update(head_dim=16, max_position_embeddings=4096, rope_theta=1e6)
    return config


def write_mlx_target(
    directory: Path,
    *,
    seed: int,
    arch: str = "llama",
    hidden: int = HIDDEN,
    common_direction: bool = False,
) -> Path:
    """A four-layer random-weight target with SmolLM2's tokenizer, in mlx-lm's format.

    With ``common_direction`` every token's embedding is one shared vector plus a little
    noise and the layers' outputs are small, so the target's rows, and a head's through
    its LM head, put their mass on the same few tokens wherever they are: a head's q then
    overlaps the target's p, which the distribution tests need to exercise acceptance.
    """
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    # Tied, a common direction is the target's output's too.
    config = target_config(arch, hidden, tied=common_direction)
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    directory.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    if common_direction:
        weights = _leaning_on_the_target(weights)
        embeddings = weights["model.embed_tokens.weight"]
        weights["model.embed_tokens.weight"] = mx.random.normal((1, hidden)) + 0.1 * embeddings
    weights = {name: value.astype(mx.float16) for name, value in weights.items()}
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    (directory / "config.json").write_text(json.dumps(config))
    copy_smollm2_tokenizer(directory)
    return directory


def copy_smollm2_tokenizer(directory: Path) -> None:
    """SmolLM2's tokenizer files (from the MLX test model) into ``directory``."""
    source = require_mlx_model(SMOLLM2_KEY)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, directory / name)


def write_eagle3_head(
    directory: Path,
    *,
    seed: int,
    hidden: int = HIDDEN,
    draft_vocab: int = VOCAB,
    layers: tuple[int, int, int] = (1, 2, 3),
) -> Path:
    """An EAGLE-3 head (speculators' format) reading the inputs of ``layers``; with a
    smaller ``draft_vocab`` its ``d2t`` maps its ids onto every 40th target id."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.speculative.drafters.eagle3 import Eagle3DraftModel, ModelConfig

    config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": {
            "model_type": "llama",
            "hidden_size": hidden,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": VOCAB,
            "rms_norm_eps": 1e-5,
        },
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": hidden,
        "eagle_aux_hidden_state_layer_ids": list(layers),
    }
    if draft_vocab == VOCAB:
        config["tie_word_embeddings"] = True  # rows through the target's LM head
    mx.random.seed(seed)
    model = Eagle3DraftModel(ModelConfig.from_dict(config))
    weights = _leaning_on_the_target(dict(tree_flatten(model.parameters())))
    # fc passes the last read layer through, so g resembles the target's late state.
    weights["fc.weight"] = 0.02 * mx.random.normal((hidden, 3 * hidden)) + mx.concatenate(
        [mx.zeros((hidden, 2 * hidden)), mx.eye(hidden)], axis=1
    )
    if draft_vocab != VOCAB:
        weights["d2t"] = (mx.arange(draft_vocab) * 39).astype(mx.int64)  # i -> 40 i
    return _save(directory, config, weights)


def write_dflash_head(
    directory: Path, *, seed: int, hidden: int = HIDDEN, layers: tuple[int, ...] = (0, 1, 3)
) -> Path:
    """A DFlash head (z-lab's format: a qwen3 config with ``dflash_config``) reading the
    outputs of ``layers``, drafting blocks of :data:`DFLASH_BLOCK`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.speculative.drafters.qwen3_dflash import DFlashDraftModel, ModelConfig

    config = {
        "model_type": "qwen3",
        "architectures": ["DFlashDraftModel"],
        "hidden_size": hidden,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
        "rope_theta": 1e6,
        "tie_word_embeddings": True,
        "block_size": DFLASH_BLOCK,
        "dflash_config": {"mask_token_id": DFLASH_MASK_TOKEN, "target_layer_ids": list(layers)},
    }
    mx.random.seed(seed)
    model = DFlashDraftModel(ModelConfig.from_dict(config))
    return _save(directory, config, _leaning_on_the_target(dict(tree_flatten(model.parameters()))))


def _leaning_on_the_target(weights: dict[str, Any]) -> dict[str, Any]:
    """The layers' outputs made small, so a head's rows (through the target's LM head)
    lean where the target's do: q overlaps p, and the accept step is put to the test."""
    import mlx.core as mx

    return {
        name: 0.02 * mx.random.normal(value.shape)
        if name.endswith(("o_proj.weight", "down_proj.weight"))
        else value
        for name, value in weights.items()
    }


def _save(directory: Path, config: dict[str, object], weights: dict[str, object]) -> Path:
    import mlx.core as mx

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(directory / "model.safetensors"), weights)  # type: ignore[arg-type]
    return directory
