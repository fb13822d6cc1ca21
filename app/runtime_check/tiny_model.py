"""A tiny random-weight llama model for the runtime check, written with ``gguf``.

Small enough to write and load in a fraction of a second, shaped so that llama.cpp
takes the kernels that differ by CPU: every matrix has rows in multiples of 32 and
columns in multiples of 256, so the CPU weight repacking (Q4_0, Q4_K, Q8_0) and, in a
build that has it, the AMX buffer type accept them; the weights are what a real
quantized model mixes (F16, Q4_0, Q4_K, Q8_0). The values are random: the check asks
whether the kernels run and give finite logits, not what they say.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARCHITECTURE = "llama"
N_LAYERS = 2
WIDTH = 256  # a multiple of 256: K-quant blocks (and AMX's Q4_K tiles) need it
N_HEADS = 4
N_KV_HEADS = 2  # grouped-query attention, as the real models use
FFN_WIDTH = 512
CONTEXT_LENGTH = 256
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
N_WORD_TOKENS = 29  # 3 special + 256 byte + 29 words = 288 rows, a multiple of 32
WEIGHT_SCALE = 0.05  # small weights keep the random activations finite


@dataclass(frozen=True)
class TinyModel:
    """What :func:`write_tiny_model` wrote, for the check's report."""

    path: Path
    architecture: str
    n_layers: int
    n_vocab: int
    weight_types: tuple[str, ...]  # the matrices' types, e.g. ("F16", "Q4_0", "Q4_K")
    size_bytes: int

    def describe(self) -> str:
        """One phrase: ``tiny random-weight llama (2 layers, 288 tokens; F16, Q4_0 weights)``."""
        return (
            f"tiny random-weight {self.architecture} ({self.n_layers} layers, "
            f"{self.n_vocab}-token vocabulary; {', '.join(self.weight_types)} weights)"
        )


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    """A sentencepiece-style vocabulary: specials, the 256 byte tokens, a few words."""
    import gguf

    tokens = list(SPECIAL_TOKENS)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    tokens += [f"\u2581word{index}" for index in range(N_WORD_TOKENS)]
    types += [gguf.TokenType.NORMAL] * N_WORD_TOKENS
    scores = [0.0] * len(SPECIAL_TOKENS) + [-1000.0] * 256
    scores += [-float(index) for index in range(N_WORD_TOKENS)]
    return tokens, scores, [int(kind) for kind in types]


def _q4_k_blocks(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K data: the ``gguf`` package cannot quantize to K-quants, so the blocks
    are made directly (144 bytes per 256 values: fp16 scale and minimum, 12 bytes of
    6-bit sub-block scales, 128 bytes of 4-bit values). Fixed small fp16 scales keep
    every value finite; the packed bytes may be anything."""
    blocks = cols // 256
    data = rng.integers(0, 256, size=(rows, blocks, 144), dtype=np.uint8)
    data[:, :, 0:2] = np.frombuffer(np.float16(0.001).tobytes(), dtype=np.uint8)
    data[:, :, 2:4] = np.frombuffer(np.float16(0.0005).tobytes(), dtype=np.uint8)
    return data.reshape(rows, blocks * 144)


def write_tiny_model(directory: Path, *, seed: int = 0) -> TinyModel:
    """Write ``directory/tiny-llama.gguf`` and say what it holds."""
    import gguf

    quant = gguf.GGMLQuantizationType
    rng = np.random.default_rng(seed)
    tokens, scores, token_types = _vocabulary()
    n_vocab = len(tokens)
    head_dim = WIDTH // N_HEADS
    kv_width = N_KV_HEADS * head_dim

    def random(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * WEIGHT_SCALE).astype(np.float32)

    def quantized(rows: int, cols: int, kind: gguf.GGMLQuantizationType) -> np.ndarray:
        return gguf.quants.quantize(random(rows, cols), kind)

    path = directory / "tiny-llama.gguf"
    directory.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, ARCHITECTURE)
    writer.add_name("draftpen runtime check")
    writer.add_block_count(N_LAYERS)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(WIDTH)
    writer.add_feed_forward_length(FFN_WIDTH)
    writer.add_head_count(N_HEADS)
    writer.add_head_count_kv(N_KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(token_types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    writer.add_tensor("token_embd.weight", random(n_vocab, WIDTH).astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, dtype=np.float32))
    writer.add_tensor("output.weight", quantized(n_vocab, WIDTH, quant.Q8_0), raw_dtype=quant.Q8_0)
    for block in range(N_LAYERS):
        prefix = f"blk.{block}."
        writer.add_tensor(prefix + "attn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(prefix + "ffn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        for name, rows in (("attn_q", WIDTH), ("attn_k", kv_width), ("attn_v", kv_width)):
            writer.add_tensor(
                prefix + name + ".weight", quantized(rows, WIDTH, quant.Q4_0), raw_dtype=quant.Q4_0
            )
        writer.add_tensor(
            prefix + "attn_output.weight",
            quantized(WIDTH, WIDTH, quant.Q4_0),
            raw_dtype=quant.Q4_0,
        )
        for name in ("ffn_gate", "ffn_up"):
            writer.add_tensor(
                prefix + name + ".weight",
                _q4_k_blocks(FFN_WIDTH, WIDTH, rng),
                raw_dtype=quant.Q4_K,
            )
        writer.add_tensor(
            prefix + "ffn_down.weight",
            quantized(WIDTH, FFN_WIDTH, quant.Q8_0),
            raw_dtype=quant.Q8_0,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinyModel(
        path=path,
        architecture=ARCHITECTURE,
        n_layers=N_LAYERS,
        n_vocab=n_vocab,
        weight_types=("F16", "Q4_0", "Q4_K", "Q8_0"),
        size_bytes=path.stat().st_size,
    )
