"""The tiny models benchmarks/hybrid_loop_cost.py measures: random-weight ``qwen35``
hybrids (tests/support/tiny_hybrid.py) and an attention-only ``qwen3`` of the same size, each with
a noisy draft, written as GGUFs and loaded with llama.cpp."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tiny_hybrid import (
    HEAD_DIM,
    N_EMBD,
    N_FF,
    N_HEAD,
    N_HEAD_KV,
    finish_gguf,
    perturbed,
    tiny_qwen35_tensors,
    write_tiny_qwen35,
)

CONTEXT = 1024
DRAFT_SCALE = (
    0.1  # the draft model's weight noise, relative (as tests/runtimes/test_hybrid_targets.py)
)


def attention_only_tensors(hybrid: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """A ``qwen3`` model of the hybrid's size: its embeddings, head, norms and FFNs, and a
    plain attention block (q, k, v, o with q/k norms) in every layer."""
    rng = np.random.default_rng(seed)
    tensors = {
        name: hybrid[name] for name in ("token_embd.weight", "output_norm.weight", "output.weight")
    }
    layers = sorted({int(name.split(".")[1]) for name in hybrid if name.startswith("blk.")})
    for layer in layers:
        prefix = f"blk.{layer}"
        tensors[f"{prefix}.attn_norm.weight"] = hybrid[f"{prefix}.attn_norm.weight"]
        tensors[f"{prefix}.ffn_norm.weight"] = hybrid[f"{prefix}.post_attention_norm.weight"]
        for part in ("ffn_gate", "ffn_up", "ffn_down"):
            tensors[f"{prefix}.{part}.weight"] = hybrid[f"{prefix}.{part}.weight"]
        shapes = {
            "attn_q": (HEAD_DIM * N_HEAD, N_EMBD),
            "attn_k": (HEAD_DIM * N_HEAD_KV, N_EMBD),
            "attn_v": (HEAD_DIM * N_HEAD_KV, N_EMBD),
            "attn_output": (N_EMBD, HEAD_DIM * N_HEAD),
        }
        for part, shape in shapes.items():
            values = rng.standard_normal(shape).astype(np.float32) * 0.05
            tensors[f"{prefix}.{part}.weight"] = values
        tensors[f"{prefix}.attn_q_norm.weight"] = np.ones(HEAD_DIM, dtype=np.float32)
        tensors[f"{prefix}.attn_k_norm.weight"] = np.ones(HEAD_DIM, dtype=np.float32)
    return tensors


def write_attention_only(
    path: Path, tokenizer_source: Path, tensors: dict[str, np.ndarray]
) -> Path:
    """Write a ``qwen3`` GGUF with ``tokenizer_source``'s tokenizer (as tiny_hybrid does)."""
    import gguf

    reader = gguf.GGUFReader(tokenizer_source)
    arch = "qwen3"
    layers = len({name.split(".")[1] for name in tensors if name.startswith("blk.")})
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    writer.add_uint32(f"{arch}.context_length", 4096)
    writer.add_uint32(f"{arch}.embedding_length", N_EMBD)
    writer.add_uint32(f"{arch}.block_count", layers)
    writer.add_uint32(f"{arch}.feed_forward_length", N_FF)
    writer.add_uint32(f"{arch}.attention.head_count", N_HEAD)
    writer.add_uint32(f"{arch}.attention.head_count_kv", N_HEAD_KV)
    writer.add_uint32(f"{arch}.attention.key_length", HEAD_DIM)
    writer.add_uint32(f"{arch}.attention.value_length", HEAD_DIM)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{arch}.rope.freq_base", 10_000_000.0)
    finish_gguf(writer, reader, tensors)
    return path


@dataclass(frozen=True)
class TinyFiles:
    """The GGUFs one run writes."""

    hybrid_mtp: Path
    hybrid: Path
    hybrid_draft: Path
    attention: Path
    attention_draft: Path


def write_files(folder: Path) -> TinyFiles:
    """Write every tiny model into ``folder``."""
    import gguf

    tokenizer = require_model(SMOLLM2_KEY)
    n_vocab = len(gguf.GGUFReader(tokenizer).fields["tokenizer.ggml.tokens"].contents())
    # One seed: the trunk is the same with and without the nextn block after it.
    weights = tiny_qwen35_tensors(n_vocab, seed=1, nextn_layers=1)
    trunk = {name: values for name, values in weights.items() if not name.startswith("blk.2.")}
    attention = attention_only_tensors(trunk, seed=2)
    return TinyFiles(
        hybrid_mtp=write_tiny_qwen35(
            folder / "tiny-qwen35-mtp.gguf", tokenizer, nextn_layers=1, tensors=weights
        ),
        hybrid=write_tiny_qwen35(folder / "tiny-qwen35.gguf", tokenizer, tensors=trunk),
        hybrid_draft=write_tiny_qwen35(
            folder / "tiny-qwen35-draft.gguf",
            tokenizer,
            tensors=perturbed(trunk, seed=7, scale=DRAFT_SCALE),
        ),
        attention=write_attention_only(folder / "tiny-qwen3.gguf", tokenizer, attention),
        attention_draft=write_attention_only(
            folder / "tiny-qwen3-draft.gguf",
            tokenizer,
            perturbed(attention, seed=7, scale=DRAFT_SCALE),
        ),
    )


def load_tiny_model(path: Path, threads: int, snapshots: int | None = None) -> Any:
    """One of the tiny models, loaded with llama.cpp at this benchmark's context."""
    from backends.llamacpp.model import LlamaCppModel

    return LlamaCppModel(path, n_ctx=CONTEXT, n_threads=threads, rollback_snapshots=snapshots)
