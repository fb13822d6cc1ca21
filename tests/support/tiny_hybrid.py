"""Tiny random-weight hybrid models (llama.cpp's ``qwen35``: Gated DeltaNet + attention).

No small published file has this architecture, so the tests write one with the
``gguf`` package: the sizes llama.cpp's own ``tests/test-llama-archs.cpp`` runs
(n_embd 256, 2 heads, n_ff 384, full attention every 2nd layer, SSM inner 256, state
128, 2 groups), the tensor names and shapes its qwen35 loader asks for, and SmolLM2's
tokenizer copied from the test store so that the CLI can drive the model like any
other. Random weights say nothing about acceptance or speed; exactness holds or fails
on them just as on real weights.

``nextn_layers=1`` appends one multi-token-prediction block (``blk.N.nextn.*`` plus a
full attention block, ``qwen35.nextn_predict_layers = 1``), as Qwen3.5/3.6 ship it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ARCH = "qwen35"
N_EMBD = 256
N_HEAD = 2
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 384
SSM_INNER = 256
SSM_STATE = 128
SSM_GROUPS = 2  # key heads
SSM_V_HEADS = 2  # value heads (llama.cpp's "time step rank")
SSM_CONV = 4
FULL_ATTENTION_INTERVAL = 2
ROPE_DIMENSIONS = 64
ROPE_SECTIONS = [11, 11, 10, 0]
# The tokens a random model mostly writes (see _output_matrix): SmolLM2's ids from 300
# on are common English word pieces.
FAVOURED_FIRST = 300
FAVOURED_TOKENS = 64

_TOKENIZER_SCALARS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
)
_TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")


def normal_weights(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Random float32 weights of ``shape``, normal with standard deviation ``scale`` (every
    tiny GGUF the tests write draws its weights so)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _attention_block(rng: np.random.Generator, prefix: str) -> dict[str, np.ndarray]:
    """A full attention block's tensors (numpy shapes are ggml's dims reversed)."""
    return {
        f"{prefix}.attn_q.weight": normal_weights(rng, (HEAD_DIM * N_HEAD * 2, N_EMBD), 0.05),
        f"{prefix}.attn_k.weight": normal_weights(rng, (HEAD_DIM * N_HEAD_KV, N_EMBD), 0.05),
        f"{prefix}.attn_v.weight": normal_weights(rng, (HEAD_DIM * N_HEAD_KV, N_EMBD), 0.05),
        f"{prefix}.attn_output.weight": normal_weights(rng, (N_EMBD, HEAD_DIM * N_HEAD), 0.05),
        f"{prefix}.attn_q_norm.weight": np.ones(HEAD_DIM, dtype=np.float32),
        f"{prefix}.attn_k_norm.weight": np.ones(HEAD_DIM, dtype=np.float32),
    }


def _delta_net_block(rng: np.random.Generator, prefix: str) -> dict[str, np.ndarray]:
    """A Gated DeltaNet (linear attention) block's tensors."""
    key_dim = SSM_STATE * SSM_GROUPS
    value_dim = (SSM_INNER // SSM_V_HEADS) * SSM_V_HEADS
    conv_dim = key_dim * 2 + value_dim
    return {
        f"{prefix}.attn_qkv.weight": normal_weights(rng, (conv_dim, N_EMBD), 0.05),
        f"{prefix}.attn_gate.weight": normal_weights(rng, (value_dim, N_EMBD), 0.05),
        f"{prefix}.ssm_conv1d.weight": normal_weights(rng, (conv_dim, SSM_CONV), 0.5),
        f"{prefix}.ssm_dt.bias": normal_weights(rng, (SSM_V_HEADS,), 0.5),
        # A = -exp(A_log): negative, so the state decays rather than blows up.
        f"{prefix}.ssm_a": -np.exp(rng.uniform(0.0, 1.5, SSM_V_HEADS)).astype(np.float32),
        f"{prefix}.ssm_beta.weight": normal_weights(rng, (SSM_V_HEADS, N_EMBD), 0.05),
        f"{prefix}.ssm_alpha.weight": normal_weights(rng, (SSM_V_HEADS, N_EMBD), 0.05),
        f"{prefix}.ssm_norm.weight": np.ones(SSM_INNER // SSM_V_HEADS, dtype=np.float32),
        f"{prefix}.ssm_out.weight": normal_weights(rng, (N_EMBD, value_dim), 0.05),
    }


def _block_common(rng: np.random.Generator, prefix: str) -> dict[str, np.ndarray]:
    return {
        f"{prefix}.attn_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        f"{prefix}.post_attention_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        f"{prefix}.ffn_gate.weight": normal_weights(rng, (N_FF, N_EMBD), 0.05),
        f"{prefix}.ffn_up.weight": normal_weights(rng, (N_FF, N_EMBD), 0.05),
        f"{prefix}.ffn_down.weight": normal_weights(rng, (N_EMBD, N_FF), 0.05),
    }


def _output_matrix(rng: np.random.Generator, n_vocab: int) -> np.ndarray:
    """The LM head: an untied one (tied to the input embeddings, a random model writes
    the token it just read, forever), whose large rows for a few hundred ordinary
    tokens make a random model write those: its output then falls into loosely
    repeating stretches within a few dozen tokens, which n-gram drafts can follow."""
    weights = normal_weights(rng, (n_vocab, N_EMBD), 0.05)
    favoured = slice(FAVOURED_FIRST, min(n_vocab, FAVOURED_FIRST + FAVOURED_TOKENS))
    weights[favoured] = normal_weights(rng, weights[favoured].shape, 0.5)
    return weights


def tiny_qwen35_tensors(
    n_vocab: int, *, seed: int, layers: int = 2, nextn_layers: int = 0
) -> dict[str, np.ndarray]:
    """Random weights for a tiny qwen35 model, by GGUF tensor name."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {
        # Large enough that the logits are peaked (a random model then writes the
        # same token at a clear margin, not by a hair that rounding could flip).
        "token_embd.weight": normal_weights(rng, (n_vocab, N_EMBD), 0.5),
        "output_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        "output.weight": _output_matrix(rng, n_vocab),
    }
    for layer in range(layers):
        prefix = f"blk.{layer}"
        tensors.update(_block_common(rng, prefix))
        if (layer + 1) % FULL_ATTENTION_INTERVAL == 0:
            tensors.update(_attention_block(rng, prefix))
        else:
            tensors.update(_delta_net_block(rng, prefix))
    for layer in range(layers, layers + nextn_layers):
        prefix = f"blk.{layer}"
        tensors.update(_block_common(rng, prefix))
        tensors.update(_attention_block(rng, prefix))
        tensors.update(passthrough_nextn(rng, prefix, N_EMBD))
        tensors[f"{prefix}.attn_output.weight"] *= 0.2
        tensors[f"{prefix}.ffn_down.weight"] *= 0.2
    return tensors


def passthrough_nextn(rng: np.random.Generator, prefix: str, width: int) -> dict[str, np.ndarray]:
    """A nextn block's own tensors for a head that mostly passes the token's embedding
    through (that half of eh_proj near identity; the caller keeps the block's own
    outputs small). The random target's next-token distribution leans on its last token
    too, so the head's q overlaps the target's p (fully random weights give disjoint
    supports, where every draft is rejected and the accept step is never put to the
    test)."""
    projection = normal_weights(rng, (width, 2 * width), 0.05)
    projection[:, :width] += np.eye(width, dtype=np.float32)
    return {
        f"{prefix}.nextn.eh_proj.weight": projection,
        f"{prefix}.nextn.enorm.weight": np.ones(width, dtype=np.float32),
        f"{prefix}.nextn.hnorm.weight": np.ones(width, dtype=np.float32),
    }


def perturbed(tensors: dict[str, np.ndarray], *, seed: int, scale: float) -> dict[str, np.ndarray]:
    """The same weights with relative noise: a draft model that agrees with its target
    often, but not always (so rounds accept some drafts and reject others)."""
    rng = np.random.default_rng(seed)
    changed = {}
    for name, values in tensors.items():
        noise = rng.standard_normal(values.shape).astype(np.float32)
        changed[name] = values + scale * float(np.std(values) or 0.0) * noise
    return changed


def mtp_only(tensors: dict[str, np.ndarray], layers: int = 2) -> dict[str, np.ndarray]:
    """Only what a separate MTP file holds: the nextn block(s), embeddings and head."""
    trunk = tuple(f"blk.{layer}." for layer in range(layers))
    return {name: values for name, values in tensors.items() if not name.startswith(trunk)}


def write_tiny_qwen35(
    path: Path,
    tokenizer_source: Path,
    *,
    seed: int = 0,
    layers: int = 2,
    nextn_layers: int = 0,
    tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write a tiny qwen35 GGUF with ``tokenizer_source``'s tokenizer; return its path.

    ``tensors`` (default: :func:`tiny_qwen35_tensors` of ``seed``) may leave the trunk
    out (:func:`mtp_only`): llama.cpp then loads the file as an MTP head alone.
    """
    import gguf

    reader = gguf.GGUFReader(tokenizer_source)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    if tensors is None:
        tensors = tiny_qwen35_tensors(
            len(tokens), seed=seed, layers=layers, nextn_layers=nextn_layers
        )
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(path.stem)
    writer.add_uint32(f"{ARCH}.context_length", 4096)
    writer.add_uint32(f"{ARCH}.embedding_length", N_EMBD)
    writer.add_uint32(f"{ARCH}.block_count", layers + nextn_layers)
    writer.add_uint32(f"{ARCH}.feed_forward_length", N_FF)
    writer.add_uint32(f"{ARCH}.attention.head_count", N_HEAD)
    writer.add_uint32(f"{ARCH}.attention.head_count_kv", N_HEAD_KV)
    writer.add_uint32(f"{ARCH}.attention.key_length", HEAD_DIM)
    writer.add_uint32(f"{ARCH}.attention.value_length", HEAD_DIM)
    writer.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_uint32(f"{ARCH}.rope.dimension_count", ROPE_DIMENSIONS)
    writer.add_array(f"{ARCH}.rope.dimension_sections", ROPE_SECTIONS)
    writer.add_float32(f"{ARCH}.rope.freq_base", 10_000_000.0)
    writer.add_uint32(f"{ARCH}.ssm.conv_kernel", SSM_CONV)
    writer.add_uint32(f"{ARCH}.ssm.inner_size", SSM_INNER)
    writer.add_uint32(f"{ARCH}.ssm.state_size", SSM_STATE)
    writer.add_uint32(f"{ARCH}.ssm.time_step_rank", SSM_V_HEADS)
    writer.add_uint32(f"{ARCH}.ssm.group_count", SSM_GROUPS)
    writer.add_uint32(f"{ARCH}.full_attention_interval", FULL_ATTENTION_INTERVAL)
    if nextn_layers:
        writer.add_uint32(f"{ARCH}.nextn_predict_layers", nextn_layers)
    finish_gguf(writer, reader, tensors)
    return path


def finish_gguf(writer: Any, reader: Any, tensors: dict[str, np.ndarray]) -> None:
    """Copy ``reader``'s tokenizer into ``writer``, add ``tensors`` and write the file.

    The architecture's own keys are the caller's (a ``gguf.GGUFWriter`` and the
    ``gguf.GGUFReader`` of the file whose tokenizer the tiny model borrows).
    """
    for key in _TOKENIZER_SCALARS:
        field = reader.fields.get(key)
        if field is not None:
            writer.add_key_value(key, field.contents(), field.types[0])
    for key in _TOKENIZER_ARRAYS:
        field = reader.fields[key]
        writer.add_key_value(key, field.contents(), field.types[0], field.types[1])
    for name, values in tensors.items():
        # The two vocabulary-sized matrices in half precision: half the file to write.
        wide = name in ("token_embd.weight", "output.weight")
        writer.add_tensor(name, values.astype(np.float16) if wide else values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
