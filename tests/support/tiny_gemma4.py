"""A tiny random-weight Gemma 4 target and its MTP "assistant" head (llama.cpp's
``gemma4`` and ``gemma4-assistant``), as Google ships Gemma 4 with a separate drafter.

The assistant is unlike other MTP heads: it keeps no cache of its own. Its layers read
the target's: its sliding-window layers the keys and values of the target's last
sliding-window layer, its full-attention layers those of the target's last layer
(llama.cpp shares them, ``src/llama-model.cpp``). It reads a token's embedding (the
target's) beside the target's last hidden state, drafts at the pending token's
position, and chains on its own hidden state, projected back to the target's width.

No small published file has these architectures, so the tests write them with the
``gguf`` package: the tensor names, shapes and keys llama.cpp's loaders ask for
(``src/models/gemma4.cpp``, ``gemma4-assistant.cpp`` and the converter's
``Gemma4AssistantModel`` in the vendored tree), without per-layer embeddings or
experts. SmolLM2's tokenizer is copied from the test store. Random weights say nothing
about acceptance or speed; exactness holds or fails on them just as on real weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.tiny_hybrid import finish_gguf, normal_weights

TARGET_ARCH = "gemma4"
HEAD_ARCH = "gemma4-assistant"
N_EMBD = 128  # the target's width (the head's "backbone")
HEAD_EMBD = 64  # the assistant's own width
N_HEAD = 2
N_HEAD_KV = 1
HEAD_DIM = 64
N_FF = 256
HEAD_FF = 128
# Sliding-window layers, then a full-attention one last: the layers the head reads.
TARGET_PATTERN = (True, False, True, False)
# As Gemma 4 ships: its last layers keep no keys and values of their own but read those
# of the last earlier layer of their kind (so the head reads layers 0 and 1's).
SHARED_KV_LAYERS = 2
HEAD_PATTERN = (True, False)
SLIDING_WINDOW = 512
FAVOURED_FIRST = 300  # SmolLM2's ids from 300 on are common English word pieces
FAVOURED_TOKENS = 24


def _ones(size: int) -> np.ndarray:
    return np.ones(size, dtype=np.float32)


def _layer(
    rng: np.random.Generator, prefix: str, width: int, n_ff: int, *, keys: bool
) -> dict[str, np.ndarray]:
    """One layer's tensors (numpy shapes: ggml's dims reversed); a layer that reads
    another's keys and values (``keys`` False: an assistant's, a target's last ones)
    projects queries only."""
    tensors = {
        f"{prefix}.attn_norm.weight": _ones(width),
        f"{prefix}.attn_q.weight": normal_weights(rng, (HEAD_DIM * N_HEAD, width), 0.05),
        f"{prefix}.attn_q_norm.weight": _ones(HEAD_DIM),
        f"{prefix}.attn_output.weight": normal_weights(rng, (width, HEAD_DIM * N_HEAD), 0.05),
        f"{prefix}.post_attention_norm.weight": _ones(width),
        f"{prefix}.layer_output_scale.weight": _ones(1),
        f"{prefix}.ffn_norm.weight": _ones(width),
        f"{prefix}.ffn_gate.weight": normal_weights(rng, (n_ff, width), 0.05),
        f"{prefix}.ffn_up.weight": normal_weights(rng, (n_ff, width), 0.05),
        f"{prefix}.ffn_down.weight": normal_weights(rng, (width, n_ff), 0.05),
        f"{prefix}.post_ffw_norm.weight": _ones(width),
    }
    if keys:
        tensors[f"{prefix}.attn_k.weight"] = normal_weights(
            rng, (HEAD_DIM * N_HEAD_KV, width), 0.05
        )
        tensors[f"{prefix}.attn_v.weight"] = normal_weights(
            rng, (HEAD_DIM * N_HEAD_KV, width), 0.05
        )
        tensors[f"{prefix}.attn_k_norm.weight"] = _ones(HEAD_DIM)
    return tensors


def _favouring(rng: np.random.Generator, n_vocab: int, width: int) -> np.ndarray:
    """An LM head whose rows for a few ordinary tokens are large, and lean on the first
    dimension, which every token's embedding carries (``_embeddings``) and so every
    hidden state: the target and the head both write mostly those tokens (their p and q
    overlap, and a reply is many tokens rather than one repeated)."""
    weights = normal_weights(rng, (n_vocab, width), 0.05)
    favoured = slice(FAVOURED_FIRST, min(n_vocab, FAVOURED_FIRST + FAVOURED_TOKENS))
    weights[favoured] = normal_weights(rng, weights[favoured].shape, 0.5)
    weights[favoured, 0] += 3.0
    return weights


def _embeddings(rng: np.random.Generator, n_vocab: int) -> np.ndarray:
    """The target's token embeddings, each with a large first dimension (see
    ``_favouring``)."""
    weights = normal_weights(rng, (n_vocab, N_EMBD), 0.05)
    weights[:, 0] = 1.0
    return weights


def _add_shape(  # type: ignore[no-untyped-def]
    writer, arch: str, width: int, layers: int, n_ff: int, pattern, shared_kv_layers: int = 0
) -> None:
    writer.add_uint32(f"{arch}.context_length", 4096)
    writer.add_uint32(f"{arch}.embedding_length", width)
    writer.add_uint32(f"{arch}.block_count", layers)
    writer.add_uint32(f"{arch}.feed_forward_length", n_ff)
    writer.add_uint32(f"{arch}.attention.head_count", N_HEAD)
    writer.add_uint32(f"{arch}.attention.head_count_kv", N_HEAD_KV)
    for key in ("key_length", "value_length", "key_length_swa", "value_length_swa"):
        writer.add_uint32(f"{arch}.attention.{key}", HEAD_DIM)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_uint32(f"{arch}.attention.sliding_window", SLIDING_WINDOW)
    writer.add_array(f"{arch}.attention.sliding_window_pattern", list(pattern))
    writer.add_uint32(f"{arch}.attention.shared_kv_layers", shared_kv_layers)
    writer.add_float32(f"{arch}.rope.freq_base", 1_000_000.0)
    writer.add_float32(f"{arch}.rope.freq_base_swa", 10_000.0)


def write_tiny_gemma4(path: Path, tokenizer_source: Path, *, seed: int = 0) -> Path:
    """Write the tiny gemma4 target with ``tokenizer_source``'s tokenizer; its path."""
    import gguf

    reader = gguf.GGUFReader(tokenizer_source)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": _embeddings(rng, n_vocab),
        "output_norm.weight": _ones(N_EMBD),
        # Untied: tied to the embeddings, a random model writes the token it just read.
        "output.weight": _favouring(rng, n_vocab, N_EMBD),
        "rope_freqs.weight": _ones(HEAD_DIM // 2),
    }
    layers = len(TARGET_PATTERN)
    for layer in range(layers):
        keys = layer < layers - SHARED_KV_LAYERS
        tensors.update(_layer(rng, f"blk.{layer}", N_EMBD, N_FF, keys=keys))
    # Written in float, then quantized to ``path`` (see _quantize_q8_0).
    unquantized = path.with_name(f"{path.stem}-f32.gguf")
    writer = gguf.GGUFWriter(str(unquantized), TARGET_ARCH)
    writer.add_name(path.stem)
    _add_shape(
        writer, TARGET_ARCH, N_EMBD, layers, N_FF, TARGET_PATTERN, shared_kv_layers=SHARED_KV_LAYERS
    )
    writer.add_uint32(f"{TARGET_ARCH}.embedding_length_per_layer_input", 0)
    finish_gguf(writer, reader, tensors)
    _quantize_q8_0(unquantized, path)
    unquantized.unlink()
    return path


def _quantize_q8_0(source: Path, path: Path) -> None:
    """Quantize ``source`` to Q8_0 at ``path``, with the installed llama.cpp.

    Why: with float weights llama.cpp multiplies a batch of rows with other kernels
    than one row, and the tiny Gemma 4's norms carried that rounding to 2.5e-3-0.02 in
    a logit (measured), enough to flip a near-tie of its random weights; in Q8_0 (and
    Q4_K) its verify batches of 2-8 rows round like one-token decoding bit for bit
    under exact kernels, as the quantized models people run do, so greedy output is
    held to plain decoding's without luck.
    """
    from backends.llamacpp.library import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(path).encode(), params)
    if status != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} (status {status})")


def write_tiny_gemma4_assistant(
    path: Path, tokenizer_source: Path, *, seed: int = 0, backbone: int = N_EMBD
) -> Path:
    """Write an assistant head for the tiny gemma4 target (``backbone``: the target
    width it was trained for; another is a head for another target); its path."""
    import gguf

    reader = gguf.GGUFReader(tokenizer_source)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    rng = np.random.default_rng(seed)
    # The token's half of the pre-projection near the identity, so that the head's q
    # leans on the pending token as the random target's p does (their supports then
    # overlap: fully random weights reject every draft, and the accept step is never
    # put to the test).
    pre = normal_weights(rng, (HEAD_EMBD, 2 * backbone), 0.05)
    pre[:, :HEAD_EMBD] += np.eye(HEAD_EMBD, dtype=np.float32) * 4.0
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": _favouring(rng, n_vocab, HEAD_EMBD),
        "output_norm.weight": _ones(HEAD_EMBD),
        "nextn.pre_projection.weight": pre,
        "nextn.post_projection.weight": normal_weights(rng, (backbone, HEAD_EMBD), 0.05),
        "rope_freqs.weight": _ones(HEAD_DIM // 2),
    }
    for layer in range(len(HEAD_PATTERN)):
        tensors.update(_layer(rng, f"blk.{layer}", HEAD_EMBD, HEAD_FF, keys=False))
    writer = gguf.GGUFWriter(str(path), HEAD_ARCH)
    writer.add_name(path.stem)
    _add_shape(writer, HEAD_ARCH, HEAD_EMBD, len(HEAD_PATTERN), HEAD_FF, HEAD_PATTERN)
    writer.add_uint32(f"{HEAD_ARCH}.embedding_length_out", backbone)
    writer.add_uint32(f"{HEAD_ARCH}.nextn_predict_layers", len(HEAD_PATTERN))
    finish_gguf(writer, reader, tensors)
    return path
