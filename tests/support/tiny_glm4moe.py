"""A tiny random-weight GLM-4.5-style target with its MTP block (llama.cpp's ``glm4moe``).

An attention-only target whose file keeps its multi-token-prediction (nextn) block, as
GLM-4.5/4.6/4.7 ship one: the kind of MTP target that can serve several sequences at
once (a hybrid one rolls back its recurrent state by replay, one sequence at a time).
No small published file has this architecture, so the tests write one with the
``gguf`` package: the tensor names, shapes and keys llama.cpp's glm4moe loader asks for
(``src/models/glm4-moe.cpp`` in the vendored tree), every trunk layer dense
(``leading_dense_block_count``) and the nextn block a mixture of 4 experts (2 used,
sigmoid gating) with a shared expert, as GLM's is. SmolLM2's tokenizer is copied from
the test store so that the CLI can drive the model like any other.

Random weights say nothing about acceptance or speed; exactness holds or fails on them
just as on real weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.tiny_hybrid import finish_gguf, normal_weights, passthrough_nextn

ARCH = "glm4moe"
N_EMBD = 128
N_HEAD = 2
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 256
N_EXPERT = 4
N_EXPERT_USED = 2
N_FF_EXPERT = 64
TRUNK_LAYERS = 2
# The tokens a random model mostly writes (SmolLM2's ids from 300 on are common English
# word pieces): its output then repeats loosely, and the head's q overlaps the target's p.
FAVOURED_FIRST = 300
FAVOURED_TOKENS = 64


def _attention(rng: np.random.Generator, prefix: str) -> dict[str, np.ndarray]:
    """An attention block with GLM's q/k/v biases (numpy shapes: ggml's dims reversed)."""
    return {
        f"{prefix}.attn_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        f"{prefix}.attn_q.weight": normal_weights(rng, (HEAD_DIM * N_HEAD, N_EMBD), 0.05),
        f"{prefix}.attn_k.weight": normal_weights(rng, (HEAD_DIM * N_HEAD_KV, N_EMBD), 0.05),
        f"{prefix}.attn_v.weight": normal_weights(rng, (HEAD_DIM * N_HEAD_KV, N_EMBD), 0.05),
        f"{prefix}.attn_q.bias": normal_weights(rng, (HEAD_DIM * N_HEAD,), 0.02),
        f"{prefix}.attn_k.bias": normal_weights(rng, (HEAD_DIM * N_HEAD_KV,), 0.02),
        f"{prefix}.attn_v.bias": normal_weights(rng, (HEAD_DIM * N_HEAD_KV,), 0.02),
        f"{prefix}.attn_output.weight": normal_weights(rng, (N_EMBD, HEAD_DIM * N_HEAD), 0.05),
        f"{prefix}.post_attention_norm.weight": np.ones(N_EMBD, dtype=np.float32),
    }


def _dense_ffn(rng: np.random.Generator, prefix: str) -> dict[str, np.ndarray]:
    return {
        f"{prefix}.ffn_gate.weight": normal_weights(rng, (N_FF, N_EMBD), 0.05),
        f"{prefix}.ffn_up.weight": normal_weights(rng, (N_FF, N_EMBD), 0.05),
        f"{prefix}.ffn_down.weight": normal_weights(rng, (N_EMBD, N_FF), 0.05),
    }


def _expert_ffn(rng: np.random.Generator, prefix: str) -> dict[str, np.ndarray]:
    """The routed experts (one 3-d tensor each), their router and the shared expert."""
    return {
        f"{prefix}.ffn_gate_inp.weight": normal_weights(rng, (N_EXPERT, N_EMBD), 0.05),
        f"{prefix}.exp_probs_b.bias": np.zeros(N_EXPERT, dtype=np.float32),
        f"{prefix}.ffn_gate_exps.weight": normal_weights(
            rng, (N_EXPERT, N_FF_EXPERT, N_EMBD), 0.05
        ),
        f"{prefix}.ffn_up_exps.weight": normal_weights(rng, (N_EXPERT, N_FF_EXPERT, N_EMBD), 0.05),
        f"{prefix}.ffn_down_exps.weight": normal_weights(
            rng, (N_EXPERT, N_EMBD, N_FF_EXPERT), 0.01
        ),
        f"{prefix}.ffn_gate_shexp.weight": normal_weights(rng, (N_FF_EXPERT, N_EMBD), 0.05),
        f"{prefix}.ffn_up_shexp.weight": normal_weights(rng, (N_FF_EXPERT, N_EMBD), 0.05),
        f"{prefix}.ffn_down_shexp.weight": normal_weights(rng, (N_EMBD, N_FF_EXPERT), 0.01),
    }


def tiny_glm4moe_tensors(n_vocab: int, *, seed: int) -> dict[str, np.ndarray]:
    """Random weights for the tiny target and its nextn block, by GGUF tensor name."""
    rng = np.random.default_rng(seed)
    output = normal_weights(rng, (n_vocab, N_EMBD), 0.05)
    favoured = slice(FAVOURED_FIRST, min(n_vocab, FAVOURED_FIRST + FAVOURED_TOKENS))
    output[favoured] = normal_weights(rng, output[favoured].shape, 0.5)
    tensors: dict[str, np.ndarray] = {
        # Large enough that the logits are peaked (greedy choices win by a clear margin).
        "token_embd.weight": normal_weights(rng, (n_vocab, N_EMBD), 0.5),
        "output_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        # Untied: tied to the embeddings, a random model writes the token it just read.
        "output.weight": output,
    }
    for layer in range(TRUNK_LAYERS):
        tensors.update(_attention(rng, f"blk.{layer}"))
        tensors.update(_dense_ffn(rng, f"blk.{layer}"))
    prefix = f"blk.{TRUNK_LAYERS}"
    tensors.update(_attention(rng, prefix))
    tensors.update(_expert_ffn(rng, prefix))
    # A head that mostly passes the token's embedding through, its own outputs small
    # (its experts' already are), so that its q overlaps the target's p.
    tensors.update(passthrough_nextn(rng, prefix, N_EMBD))
    tensors[f"{prefix}.attn_output.weight"] *= 0.2
    tensors[f"{prefix}.nextn.shared_head_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
    return tensors


def write_tiny_glm4moe(path: Path, tokenizer_source: Path, *, seed: int = 0) -> Path:
    """Write the tiny glm4moe target, MTP block kept, with ``tokenizer_source``'s
    tokenizer; return its path."""
    import gguf

    reader = gguf.GGUFReader(tokenizer_source)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(path.stem)
    writer.add_uint32(f"{ARCH}.context_length", 4096)
    writer.add_uint32(f"{ARCH}.embedding_length", N_EMBD)
    writer.add_uint32(f"{ARCH}.block_count", TRUNK_LAYERS + 1)
    writer.add_uint32(f"{ARCH}.feed_forward_length", N_FF)
    writer.add_uint32(f"{ARCH}.attention.head_count", N_HEAD)
    writer.add_uint32(f"{ARCH}.attention.head_count_kv", N_HEAD_KV)
    writer.add_uint32(f"{ARCH}.attention.key_length", HEAD_DIM)
    writer.add_uint32(f"{ARCH}.attention.value_length", HEAD_DIM)
    writer.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_uint32(f"{ARCH}.rope.dimension_count", HEAD_DIM // 2)
    writer.add_float32(f"{ARCH}.rope.freq_base", 1_000_000.0)
    writer.add_uint32(f"{ARCH}.expert_count", N_EXPERT)
    writer.add_uint32(f"{ARCH}.expert_used_count", N_EXPERT_USED)
    writer.add_uint32(f"{ARCH}.expert_shared_count", 1)
    writer.add_uint32(f"{ARCH}.expert_feed_forward_length", N_FF_EXPERT)
    writer.add_uint32(f"{ARCH}.leading_dense_block_count", TRUNK_LAYERS)
    writer.add_bool(f"{ARCH}.expert_weights_norm", True)
    writer.add_float32(f"{ARCH}.expert_weights_scale", 1.0)
    writer.add_uint32(f"{ARCH}.expert_gating_func", 2)  # sigmoid, as GLM-4.5's
    writer.add_uint32(f"{ARCH}.nextn_predict_layers", 1)
    finish_gguf(writer, reader, tiny_glm4moe_tensors(n_vocab, seed=seed))
    return path
