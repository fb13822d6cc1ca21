"""A synthetic target+draft pair with real shapes and a chosen agreement, for GPU timing.

The machines lent for GPU measurements cannot reach the Hugging Face hub, and a
multi-GB model cannot travel to them. What a timing needs is the real *shapes* (the
forward cost) and a draft that agrees with the target about as often as a real one:

- ``tokenizer SRC.gguf OUT.json.gz`` (here): a real GGUF's tokenizer metadata, ~3 MB.
- ``pair TOKENIZER.json.gz DIR`` (there): writes ``target.gguf`` (Qwen2.5-7B's shapes:
  28 layers, 3584 wide, GQA 28/4, FFN 18944) and ``draft.gguf`` (Qwen2.5-0.5B's: 24
  layers, 896 wide, GQA 14/2, FFN 4864), float16, sharing the real vocabulary.

How the two agree: every block's output projections (``attn_output``, ``ffn_down``) are
zero, so each block adds nothing to the residual stream and a model's logits are a
function of the current token alone: a bigram model, while every matrix product is
still computed (the forward cost is the real one). The target's embedding and output
matrices are ``E @ A`` and ``O @ A`` with ``A`` (896 x 3584) having orthonormal rows, the
draft's are ``E`` and ``O`` (plus noise): through the RMS norms the two give the same
logits up to a constant factor, which the draft's output norm weight cancels. With
``--draft-noise 0`` the draft agrees always; the noise sets how often it does not (the
command prints the greedy agreement it measured on the matrices).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
)
SHAPES = {
    # name: (layers, width, heads, kv_heads, ffn)
    "qwen2.5-7b": (28, 3584, 28, 4, 18944),
    "qwen2.5-0.5b": (24, 896, 14, 2, 4864),
}
LOGIT_SCALE = 4.0  # spread of the bigram logits: a peaked, text-like next-token choice


def export_tokenizer(source: Path, output: Path) -> None:
    """Write the tokenizer metadata of ``source`` (a GGUF file) as gzipped JSON."""
    import gguf

    reader = gguf.GGUFReader(source)
    data = {}
    for key in TOKENIZER_KEYS:
        field = reader.fields.get(key)
        if field is not None:
            value = field.contents()
            data[key] = value.tolist() if hasattr(value, "tolist") else value
    with gzip.open(output, "wt", encoding="utf-8") as file:
        json.dump(data, file)


def _write_model(
    path: Path,
    tokenizer: dict,
    shape: tuple[int, int, int, int, int],
    embedding: np.ndarray,
    output: np.ndarray,
    output_norm: float,
    rng: np.random.Generator,
) -> None:
    import gguf

    layers, width, heads, kv_heads, ffn = shape
    head_dim = width // heads
    kv_width = kv_heads * head_dim
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_name(f"synthetic {path.stem}")
    writer.add_block_count(layers)
    writer.add_context_length(32768)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model(tokenizer["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(tokenizer["tokenizer.ggml.pre"])
    writer.add_token_list(tokenizer["tokenizer.ggml.tokens"])
    writer.add_token_types(tokenizer["tokenizer.ggml.token_type"])
    writer.add_token_merges(tokenizer["tokenizer.ggml.merges"])
    writer.add_eos_token_id(tokenizer["tokenizer.ggml.eos_token_id"])
    writer.add_pad_token_id(tokenizer["tokenizer.ggml.padding_token_id"])
    writer.add_bos_token_id(tokenizer["tokenizer.ggml.bos_token_id"])
    writer.add_add_bos_token(bool(tokenizer["tokenizer.ggml.add_bos_token"]))
    writer.add_chat_template(tokenizer["tokenizer.chat_template"])
    # One pool of random values, sliced per tensor: generating ~7e9 fresh values would
    # cost minutes of device time, and a timing does not care which values they are.
    pool = (rng.standard_normal(1 << 27, dtype=np.float32) * 0.02).astype(np.float16)

    def random_matrix(rows: int, cols: int) -> np.ndarray:
        start = int(rng.integers(0, pool.size - rows * cols + 1))
        return pool[start : start + rows * cols].reshape(rows, cols)

    writer.add_tensor("token_embd.weight", embedding.astype(np.float16))
    writer.add_tensor("output.weight", output.astype(np.float16))
    writer.add_tensor("output_norm.weight", np.full(width, output_norm, dtype=np.float32))
    for block in range(layers):
        prefix = f"blk.{block}."
        writer.add_tensor(prefix + "attn_norm.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(prefix + "ffn_norm.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(prefix + "attn_q.weight", random_matrix(width, width))
        writer.add_tensor(prefix + "attn_k.weight", random_matrix(kv_width, width))
        writer.add_tensor(prefix + "attn_v.weight", random_matrix(kv_width, width))
        writer.add_tensor(prefix + "attn_q.bias", np.zeros(width, dtype=np.float32))
        writer.add_tensor(prefix + "attn_k.bias", np.zeros(kv_width, dtype=np.float32))
        writer.add_tensor(prefix + "attn_v.bias", np.zeros(kv_width, dtype=np.float32))
        # Zero output projections: the block adds nothing (see the module docstring).
        writer.add_tensor(prefix + "attn_output.weight", np.zeros((width, width), np.float16))
        writer.add_tensor(prefix + "ffn_gate.weight", random_matrix(ffn, width))
        writer.add_tensor(prefix + "ffn_up.weight", random_matrix(ffn, width))
        writer.add_tensor(prefix + "ffn_down.weight", np.zeros((width, ffn), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_pair(tokenizer_path: Path, directory: Path, draft_noise: float, seed: int) -> None:
    """Write target.gguf and draft.gguf into ``directory``; print their greedy agreement."""
    with gzip.open(tokenizer_path, "rt", encoding="utf-8") as file:
        tokenizer = json.load(file)
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"])
    target_shape, draft_shape = SHAPES["qwen2.5-7b"], SHAPES["qwen2.5-0.5b"]
    rank, width = draft_shape[1], target_shape[1]
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((n_vocab, rank), dtype=np.float32)
    out = rng.standard_normal((n_vocab, rank), dtype=np.float32) * (LOGIT_SCALE / np.sqrt(rank))
    # Special tokens (end of turn among them) never win, so replies run their length.
    special = np.asarray(tokenizer["tokenizer.ggml.token_type"]) != 1
    out[special] = 0.0
    noisy_out = out + rng.standard_normal(out.shape, dtype=np.float32) * (
        draft_noise * LOGIT_SCALE / np.sqrt(rank)
    )
    noisy_out[special] = 0.0
    basis, _ = np.linalg.qr(rng.standard_normal((width, rank), dtype=np.float32))
    lift = basis.T  # rank x width, orthonormal rows
    sample = rng.choice(n_vocab, 512, replace=False)
    agree = np.mean(
        np.argmax(embed[sample] @ out.T, axis=1) == np.argmax(embed[sample] @ noisy_out.T, axis=1)
    )
    print(f"greedy agreement of draft and target over 512 contexts: {agree:.2f}", flush=True)
    directory.mkdir(parents=True, exist_ok=True)
    # RMS norms: the target normalises a vector sqrt(width / rank) times smaller per
    # element, so the draft's output norm weight makes up the difference.
    _write_model(
        directory / "draft.gguf",
        tokenizer,
        draft_shape,
        embed,
        noisy_out,
        float(np.sqrt(width / rank)),
        rng,
    )
    _write_model(
        directory / "target.gguf", tokenizer, target_shape, embed @ lift, out @ lift, 1.0, rng
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: ``tokenizer`` here, ``pair`` on the GPU machine."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("tokenizer", help="export a GGUF's tokenizer metadata")
    export.add_argument("source", type=Path)
    export.add_argument("output", type=Path)
    pair = commands.add_parser("pair", help="write target.gguf and draft.gguf")
    pair.add_argument("tokenizer", type=Path)
    pair.add_argument("directory", type=Path)
    pair.add_argument("--draft-noise", type=float, default=0.35)
    pair.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "tokenizer":
        export_tokenizer(args.source, args.output)
    else:
        write_pair(args.tokenizer, args.directory, args.draft_noise, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
