"""Tiny random-weight targets (llama, qwen3) and EAGLE-3 heads for them, as GGUF files.

No small published EAGLE-3 head exists, so the tests write one with the ``gguf``
package, with the tensor names and metadata llama.cpp's gguf-py declares for the
``eagle3`` architecture: one decoder block whose attention reads the token's embedding
beside ``g`` (``blk.0.attn_q`` etc. are ``2 * n_embd`` wide, ``blk.0.attn_norm_2`` norms
``g``), ``fc`` (the three target layers' inputs, concatenated, down to ``n_embd``),
``{arch}.target_layers`` (which target layers' inputs it reads) and
``{arch}.target_hidden_size``. A head without ``token_embd`` and ``output`` borrows the
target's, as published Llama 3.1 heads do. Targets and heads borrow SmolLM2's
tokenizer from the test store (tests/support/tiny_hybrid.py's ``finish_gguf``).

Random weights say nothing about acceptance; exactness holds or fails on them just as
on real weights. The head is built to overlap the target's next-token distribution a
little (see :func:`eagle3_head_tensors`), so that sampled drafts are sometimes accepted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.tiny_hybrid import finish_gguf, normal_weights

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 128
TARGET_LAYERS = 4
# The target layers whose inputs the head reads (llama.cpp requires exactly three).
READ_LAYERS = (1, 2, 3)
HEAD_N_FF = 96
FAVOURED_FIRST = 300  # SmolLM2's ids from here on are common English word pieces
FAVOURED_TOKENS = 64


def _ones(size: int) -> np.ndarray:
    return np.ones(size, dtype=np.float32)


def tiny_target_tensors(
    n_vocab: int, *, seed: int, qk_norm: bool = False, n_embd: int = N_EMBD
) -> dict[str, np.ndarray]:
    """Random weights for a tiny llama (or, with ``qk_norm``, qwen3) target.

    The untied LM head has large rows for a few dozen ordinary tokens, so the random
    model writes those at a clear margin (rounding then never flips a greedy token).
    """
    rng = np.random.default_rng(seed)
    head_dim = n_embd // N_HEAD
    output = normal_weights(rng, (n_vocab, n_embd), 0.05)
    favoured = slice(FAVOURED_FIRST, min(n_vocab, FAVOURED_FIRST + FAVOURED_TOKENS))
    output[favoured] = normal_weights(rng, output[favoured].shape, 0.5)
    tensors = {
        "token_embd.weight": normal_weights(rng, (n_vocab, n_embd), 0.5),
        "output_norm.weight": _ones(n_embd),
        "output.weight": output,
    }
    for layer in range(TARGET_LAYERS):
        prefix = f"blk.{layer}"
        tensors |= {
            f"{prefix}.attn_norm.weight": _ones(n_embd),
            f"{prefix}.attn_q.weight": normal_weights(rng, (head_dim * N_HEAD, n_embd), 0.1),
            f"{prefix}.attn_k.weight": normal_weights(rng, (head_dim * N_HEAD_KV, n_embd), 0.1),
            f"{prefix}.attn_v.weight": normal_weights(rng, (head_dim * N_HEAD_KV, n_embd), 0.1),
            f"{prefix}.attn_output.weight": normal_weights(rng, (n_embd, head_dim * N_HEAD), 0.1),
            f"{prefix}.ffn_norm.weight": _ones(n_embd),
            f"{prefix}.ffn_gate.weight": normal_weights(rng, (N_FF, n_embd), 0.1),
            f"{prefix}.ffn_up.weight": normal_weights(rng, (N_FF, n_embd), 0.1),
            f"{prefix}.ffn_down.weight": normal_weights(rng, (n_embd, N_FF), 0.1),
        }
        if qk_norm:
            tensors[f"{prefix}.attn_q_norm.weight"] = _ones(head_dim)
            tensors[f"{prefix}.attn_k_norm.weight"] = _ones(head_dim)
    return tensors


def eagle3_head_tensors(
    target: dict[str, np.ndarray], *, seed: int, own_vocabulary: bool = False
) -> dict[str, np.ndarray]:
    """Random weights for an EAGLE-3 head over ``target``'s features.

    ``fc`` passes the last read layer's input through (near identity) and the block's
    own outputs are small, so ``g`` resembles the target's late hidden state and the
    head's row (through the target's LM head, or a copy of it with ``own_vocabulary``)
    leans where the target's does: q overlaps p, and the accept step is put to the test.
    """
    rng = np.random.default_rng(seed)
    n_embd = int(target["output_norm.weight"].shape[0])
    head_dim = n_embd // N_HEAD
    fc = normal_weights(rng, (n_embd, len(READ_LAYERS) * n_embd), 0.02)
    fc[:, -n_embd:] += np.eye(n_embd, dtype=np.float32)
    tensors = {
        "fc.weight": fc,
        "output_norm.weight": _ones(n_embd),
        "blk.0.attn_norm.weight": _ones(n_embd),
        "blk.0.attn_norm_2.weight": _ones(n_embd),
        "blk.0.attn_q.weight": normal_weights(rng, (head_dim * N_HEAD, 2 * n_embd), 0.1),
        "blk.0.attn_k.weight": normal_weights(rng, (head_dim * N_HEAD_KV, 2 * n_embd), 0.1),
        "blk.0.attn_v.weight": normal_weights(rng, (head_dim * N_HEAD_KV, 2 * n_embd), 0.1),
        "blk.0.attn_output.weight": normal_weights(rng, (n_embd, head_dim * N_HEAD), 0.02),
        "blk.0.ffn_norm.weight": _ones(n_embd),
        "blk.0.ffn_gate.weight": normal_weights(rng, (HEAD_N_FF, n_embd), 0.1),
        "blk.0.ffn_up.weight": normal_weights(rng, (HEAD_N_FF, n_embd), 0.1),
        "blk.0.ffn_down.weight": normal_weights(rng, (n_embd, HEAD_N_FF), 0.02),
    }
    if own_vocabulary:
        tensors["token_embd.weight"] = target["token_embd.weight"].copy()
        tensors["output.weight"] = target["output.weight"].copy()
    return tensors


def write_tiny_target(
    path: Path,
    tokenizer_source: Path,
    *,
    seed: int = 0,
    arch: str = "llama",
    n_embd: int = N_EMBD,
) -> Path:
    """Write a tiny ``llama`` or ``qwen3`` target with ``tokenizer_source``'s tokenizer."""
    import gguf

    reader = gguf.GGUFReader(tokenizer_source)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    tensors = tiny_target_tensors(n_vocab, seed=seed, qk_norm=arch == "qwen3", n_embd=n_embd)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    _add_block_shape(writer, arch, n_embd, TARGET_LAYERS, N_FF)
    finish_gguf(writer, reader, tensors)
    return path


def write_eagle3_head(
    path: Path,
    target_path: Path,
    *,
    seed: int = 0,
    own_vocabulary: bool = False,
    tokenizer_source: Path | None = None,
    read_layers: tuple[int, ...] = READ_LAYERS,
) -> Path:
    """Write an EAGLE-3 head for the tiny target at ``target_path``.

    Its tokenizer is the target's (as llama.cpp's converter copies it with
    ``--target-model-dir``) unless ``tokenizer_source`` names another file: a head for
    another model's vocabulary, which draftpen must refuse.
    """
    import gguf

    target_reader = gguf.GGUFReader(target_path)
    target = {
        tensor.name: np.array(tensor.data, dtype=np.float32) for tensor in target_reader.tensors
    }
    n_embd = int(target["output_norm.weight"].shape[0])
    tensors = eagle3_head_tensors(target, seed=seed, own_vocabulary=own_vocabulary)
    reader = gguf.GGUFReader(tokenizer_source) if tokenizer_source is not None else target_reader
    writer = gguf.GGUFWriter(str(path), "eagle3")
    writer.add_name(path.stem)
    _add_block_shape(writer, "eagle3", n_embd, 1, HEAD_N_FF)
    writer.add_array("eagle3.target_layers", list(read_layers))
    writer.add_uint32("eagle3.target_hidden_size", n_embd)
    writer.add_bool("eagle3.norm_before_residual", False)
    writer.add_bool("eagle3.norm_before_fc", False)
    finish_gguf(writer, reader, tensors)
    return path


def _add_block_shape(writer: object, arch: str, n_embd: int, layers: int, n_ff: int) -> None:
    """The llama-style hyperparameters every one of these files declares."""
    add_uint32 = writer.add_uint32  # type: ignore[attr-defined]
    add_uint32(f"{arch}.context_length", 4096)
    add_uint32(f"{arch}.embedding_length", n_embd)
    add_uint32(f"{arch}.block_count", layers)
    add_uint32(f"{arch}.feed_forward_length", n_ff)
    add_uint32(f"{arch}.attention.head_count", N_HEAD)
    add_uint32(f"{arch}.attention.head_count_kv", N_HEAD_KV)
    add_uint32(f"{arch}.rope.dimension_count", n_embd // N_HEAD)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)  # type: ignore[attr-defined]
    writer.add_float32(f"{arch}.rope.freq_base", 10_000.0)  # type: ignore[attr-defined]
