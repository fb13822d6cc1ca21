"""Loading a DFlash or DSpark head's GGUF (llama.cpp's ``dflash`` architecture) for a
llama.cpp target, what its metadata says about its block, and refusing one trained for
another target (hidden size, vocabulary, layers) or a target llama.cpp cannot feed it.

A DSpark head is a DFlash head with a Markov head (``markov_w1``/``markov_w2``): llama.cpp
tells the two apart by that tensor, and so does :func:`block_head_facts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.llamacpp.eagle3_files import (
    eagle3_unavailable,
    head_layer_ids,
    load_head_weights,
    model_metadata,
    target_mismatch,
)
from backends.llamacpp.library import llama_cpp

# What llama.cpp assumes where a head's file does not say (common/speculative.cpp).
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class BlockHeadFacts:
    """What a DFlash/DSpark head's file says about the blocks it drafts.

    ``block_size`` tokens are decoded per block: the pending token (the anchor) then
    mask tokens. A DFlash head's drafts are read at the mask slots (``block_size - 1``
    of them); a DSpark head that samples from its anchor reads every slot, the anchor's
    row drafting the token after it (``block_size``). ``causal``: the block's attention
    is causal (trained so); non-causal otherwise, as block diffusion reads the block.
    """

    kind: str  # "dflash" or "dspark"
    block_size: int
    mask_token: int
    anchor_drafts: bool
    causal: bool

    @property
    def max_drafts(self) -> int:
        """The most tokens one block drafts."""
        return self.block_size if self.anchor_drafts else self.block_size - 1


def load_dflash_weights(path: Path, target: Any, target_name: str, *, gpu_layers: int) -> Any:
    """Load a DFlash or DSpark head's GGUF for ``target`` (this machine's devices alone);
    the caller owns the weights. Refused, with the reason, when the build cannot run
    it, the file is no DFlash head, or it was trained for another target."""
    return load_head_weights(
        path, target, target_name, "a DFlash or DSpark head", _mismatch, gpu_layers
    )


def block_head_facts(path: Path, weights: Any) -> BlockHeadFacts:
    """The block a loaded head drafts (``path``: its file, for the Markov head's tensor)."""
    import gguf  # a dependency of draftpen's; read here only, for one tensor's name

    reader = gguf.GGUFReader(path)
    dspark = any(tensor.name == "markov_w1.weight" for tensor in reader.tensors)
    size = model_metadata(weights, "dflash.block_size")
    from_anchor = model_metadata(weights, "dflash.sample_from_anchor")
    causal = model_metadata(weights, "dflash.attention.causal")
    return BlockHeadFacts(
        kind="dspark" if dspark else "dflash",
        block_size=int(size) if size is not None else DEFAULT_BLOCK_SIZE,
        mask_token=int(llama_cpp.llama_vocab_mask(llama_cpp.llama_model_get_vocab(weights))),
        # llama.cpp's default where the key is absent; only DSpark heads read the anchor.
        anchor_drafts=dspark and from_anchor in (None, "true"),
        causal=causal == "true",
    )


def _mismatch(weights: Any, target: Any) -> str | None:
    """What makes ``weights`` unfit to draft for ``target`` (None: nothing)."""
    architecture = model_metadata(weights, "general.architecture")
    if architecture != "dflash":
        return f"its architecture is {architecture}, not dflash"
    target_embd = int(llama_cpp.llama_model_n_embd(target))
    # The head's fc reads its layers' inputs at its own width (llama.cpp sizes it so).
    hidden = model_metadata(weights, "dflash.target_hidden_size") or str(
        int(llama_cpp.llama_model_n_embd(weights))
    )
    if int(hidden) != target_embd:
        return f"it reads a hidden size of {hidden}, the target's is {target_embd}"
    target_layers = int(llama_cpp.llama_model_n_layer(target))
    layer_ids = head_layer_ids(weights)
    if not layer_ids or not all(0 <= layer < target_layers for layer in layer_ids):
        return f"it reads layers {layer_ids}, the target has layers 0..{target_layers - 1}"
    if int(llama_cpp.llama_vocab_mask(llama_cpp.llama_model_get_vocab(weights))) < 0:
        return "its tokenizer names no mask token (tokenizer.ggml.mask_token_id)"
    size = model_metadata(weights, "dflash.block_size")
    if size is not None and int(size) < 2:
        return f"its block size is {size}; a block drafts after its first token"
    return target_mismatch(weights, target)


# Exported by a libllama that knows llama.cpp's dflash architecture (src/llama-ext.h).
_DFLASH_SYMBOLS = (
    "llama_model_dflash_selector_top_k",
    "_Z33llama_model_dflash_selector_top_kPK11llama_model",
)


def dflash_unavailable() -> str | None:
    """Why this libllama cannot run DFlash or DSpark heads (None: it can): they read the
    target's layer inputs as an EAGLE-3 head does, and load as the dflash architecture."""
    missing = eagle3_unavailable()
    if missing is not None:
        return missing.replace("an EAGLE-3 head", "a DFlash head")
    library = llama_cpp.llama_cpp._lib
    if not any(getattr(library, name, None) is not None for name in _DFLASH_SYMBOLS):
        return (
            "this llama.cpp build predates llama.cpp's dflash architecture; install "
            "llama-cpp-python 0.3.36 or later"
        )
    return None
