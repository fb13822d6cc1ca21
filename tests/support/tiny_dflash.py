"""Tiny random-weight DFlash and DSpark heads for the tiny targets of tiny_eagle3.py, as GGUF.

No small published DFlash head exists, so the tests write one with the ``gguf`` package,
with the tensor names and metadata llama.cpp's gguf-py declares for the ``dflash``
architecture: ``fc`` (the read layers' inputs, concatenated, down to ``n_embd``),
``enc.output_norm`` (the norm after it), and a qwen3-style decoder (``blk.N.attn_q`` ...,
with ``attn_q_norm``/``attn_k_norm``) whose final norm is ``output_norm``; no
``token_embd`` or ``output``, so it borrows the target's, as published heads do.
``dflash.target_layers`` names the target layers whose inputs it reads,
``dflash.block_size`` its block, and its tokenizer (the target's) a mask token
(``tokenizer.ggml.mask_token_id``). A DSpark head adds the Markov head's ``markov_w1``
and ``markov_w2``.

Random weights say nothing about acceptance; exactness holds or fails on them just as
on real weights. The layers' outputs are small, so each slot's row is near the target's
LM head over its input embedding (the mask token's), which overlaps the target's rows a
little: sampled drafts are sometimes accepted, and the accept step is put to the test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.tiny_eagle3 import N_HEAD, N_HEAD_KV, _add_block_shape
from tests.support.tiny_hybrid import finish_gguf, normal_weights

HEAD_LAYERS = 2
HEAD_N_FF = 96
READ_LAYERS = (1, 2, 3)
BLOCK_SIZE = 8
MASK_TOKEN = 3  # a special token of SmolLM2's that replies never hold
MARKOV_RANK = 8


def dflash_head_tensors(
    n_embd: int, n_vocab: int, *, seed: int, read_layers: int, markov: bool
) -> dict[str, np.ndarray]:
    """Random weights for a DFlash head (with ``markov``, DSpark) reading ``read_layers``
    layers of an ``n_embd`` wide target (numpy shapes are ggml's dims reversed)."""
    rng = np.random.default_rng(seed)
    head_dim = n_embd // N_HEAD
    ones = np.ones(n_embd, dtype=np.float32)
    tensors = {
        "fc.weight": normal_weights(rng, (n_embd, read_layers * n_embd), 0.1),
        "enc.output_norm.weight": ones,
        "output_norm.weight": ones,
    }
    for layer in range(HEAD_LAYERS):
        prefix = f"blk.{layer}"
        tensors |= {
            f"{prefix}.attn_norm.weight": ones,
            f"{prefix}.attn_q.weight": normal_weights(rng, (head_dim * N_HEAD, n_embd), 0.1),
            f"{prefix}.attn_k.weight": normal_weights(rng, (head_dim * N_HEAD_KV, n_embd), 0.1),
            f"{prefix}.attn_v.weight": normal_weights(rng, (head_dim * N_HEAD_KV, n_embd), 0.1),
            f"{prefix}.attn_output.weight": normal_weights(rng, (n_embd, head_dim * N_HEAD), 0.05),
            f"{prefix}.attn_q_norm.weight": np.ones(head_dim, dtype=np.float32),
            f"{prefix}.attn_k_norm.weight": np.ones(head_dim, dtype=np.float32),
            f"{prefix}.ffn_norm.weight": ones,
            f"{prefix}.ffn_gate.weight": normal_weights(rng, (HEAD_N_FF, n_embd), 0.1),
            f"{prefix}.ffn_up.weight": normal_weights(rng, (HEAD_N_FF, n_embd), 0.1),
            f"{prefix}.ffn_down.weight": normal_weights(rng, (n_embd, HEAD_N_FF), 0.05),
        }
    if markov:
        tensors["markov_w1.weight"] = normal_weights(rng, (n_vocab, MARKOV_RANK), 0.3)
        tensors["markov_w2.weight"] = normal_weights(rng, (n_vocab, MARKOV_RANK), 0.3)
    return tensors


def write_dflash_head(
    path: Path,
    target_path: Path,
    *,
    seed: int = 0,
    dspark: bool = False,
    tokenizer_source: Path | None = None,
    read_layers: tuple[int, ...] = READ_LAYERS,
    block_size: int = BLOCK_SIZE,
) -> Path:
    """Write a DFlash (or, with ``dspark``, DSpark) head for the tiny target at
    ``target_path``; its tokenizer is the target's unless ``tokenizer_source`` names
    another file (a head for another vocabulary, which draftpen must refuse)."""
    import gguf

    target_reader = gguf.GGUFReader(target_path)
    n_embd = (
        int(target_reader.fields["llama.embedding_length"].contents())
        if ("llama.embedding_length" in target_reader.fields)
        else int(target_reader.fields["qwen3.embedding_length"].contents())
    )
    reader = gguf.GGUFReader(tokenizer_source) if tokenizer_source is not None else target_reader
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    tensors = dflash_head_tensors(
        n_embd, n_vocab, seed=seed, read_layers=len(read_layers), markov=dspark
    )
    writer = gguf.GGUFWriter(str(path), "dflash")
    writer.add_name(path.stem)
    _add_block_shape(writer, "dflash", n_embd, HEAD_LAYERS, HEAD_N_FF)
    writer.add_array("dflash.target_layers", list(read_layers))
    writer.add_uint32("dflash.block_size", block_size)
    writer.add_uint32("tokenizer.ggml.mask_token_id", MASK_TOKEN)
    finish_gguf(writer, reader, tensors)
    return path
