"""The settings a GGUF model and its llama.cpp context load with: GPU layers, the MTP
layers, recurrent-state snapshots, and the exact kernels under which small verify
batches round like one-token decoding."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backends.llamacpp.library import llama_cpp

if TYPE_CHECKING:
    from backends.llamacpp.placement import Placement

GGML_TYPE_BF16 = 30  # ggml.h; llama_cpp does not export this one


def model_params(*, placement: Placement, load_mtp: bool, exact_kernels: bool) -> Any:
    """``llama_model_params`` for loading a model's weights where ``placement`` says."""
    params = llama_cpp.llama_model_default_params()
    placement.apply(params)
    # The multi-token-prediction layers, where the file has them (one block): the
    # "mtp" drafter runs them (backends/llamacpp/mtp.py).
    params.load_mtp = load_mtp
    # With exact kernels, verify batches of up to 7 tokens compute logits bit for bit
    # like one-token decoding (measured on our 2-core AVX-512 machine with the starter
    # target, Q4_K_M); with llama.cpp's defaults no batch does past 512 tokens of
    # context. Part one: no weight repacking. Repacked CPU weights have batched
    # kernels of their own: from 4 tokens on they differed by up to 0.5 in a logit.
    # Reading the weights into memory (no mmap) kept plain decoding within 2% of the
    # repacked speed; memory-mapped it was 6% slower. (From 8 tokens on, llama.cpp's
    # tiled K-quant matmul rounds differently; it cannot be turned off per model.)
    if exact_kernels:
        params.use_extra_bufts = False
        params.use_mmap = False
    return params


def parallel_refusal(recurrent: bool, parallel: int) -> str | None:
    """Why a model cannot decode ``parallel`` sequences at once (None: it can)."""
    if parallel <= 1:
        return None
    if recurrent:
        return "a recurrent state (hybrid model) is rolled back per sequence; runs in turn"
    return None


def context_params(
    *,
    n_ctx: int,
    n_seq: int = 1,
    one_cache: bool = True,
    n_batch: int,
    threads: int,
    recurrent_snapshots: int | None,
    bf16_v_cache: bool,
) -> Any:
    """``llama_context_params`` for a model's one context (``n_seq`` sequences;
    ``recurrent_snapshots`` for a recurrent state, None for a KV cache alone)."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = n_batch
    params.n_ubatch = n_batch
    params.n_seq_max = n_seq
    # One cache for all sequences, as llama-server keeps it: a batch of several
    # sequences is one ubatch whatever each one's length (separate streams split it
    # into equal-length pieces, one weight read each). But in one cache a sequence's
    # cells may fall out of position order (another's rollback leaves holes), and
    # attention then adds them up in another order than alone: so exact kernels keep a
    # stream per sequence (``one_cache`` False), laid out as the sequence alone would be.
    params.kv_unified = n_seq > 1 and one_cache
    if recurrent_snapshots is not None:
        params.n_rs_seq = recurrent_snapshots
    params.n_threads = threads
    params.n_threads_batch = threads
    params.no_perf = True
    if bf16_v_cache:
        # Part two: a BF16 V cache, so one-token decoding and verify batches take the
        # same attention kernel at every context length. With F16 K and V, a
        # one-token decode splits the cache across threads once its view reaches 512
        # cells and merges partial softmaxes, while a batch takes the one-pass kernel:
        # from 300 tokens of context even a batch of 2 differed by 0.45 in a logit.
        # The split needs K and V of the same 16-bit type. The price, measured here:
        # decoding 0.92-1.07x the F16 time per token at 200-2400 tokens of context,
        # but reading a prompt is slower (no tiled attention either): 512 tokens
        # 8.8 s against 6.8 s, 2048 tokens 68.5 s against 29.0 s.
        params.type_v = GGML_TYPE_BF16
    return params
