"""Loading an EAGLE-3 head's GGUF for a llama.cpp target, and refusing one trained for
another target (hidden size, vocabulary, layers) or a target llama.cpp cannot feed it
(the loading and the target's checks serve DFlash heads too: ``dflash_files``).

The functions that switch a target's layer-input extraction on and read it, and a
head's list of target layers, are in llama.cpp's staging header ``src/llama-ext.h``,
which llama-cpp-python does not bind (its ``llama_cpp_ext`` has the nextn ones only):
they are bound here, by their exported (C++ mangled) names, and the C names first in
case a later build exports those.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from backends.errors import ModelLoadError
from backends.llamacpp.library import check_gguf_file, llama_cpp
from backends.llamacpp.placement import local_placement
from backends.llamacpp.vocab import vocab_facts, vocab_token_text

# Architectures whose llama.cpp graph hands out its layers' inputs (``t_layer_inp`` in
# src/models/<arch>.cpp); on any other, switching the extraction on aborts the process
# at the next decode (GGML_ASSERT "layer input tensor is null"), so it is refused first.
LAYER_INPUT_ARCHITECTURES = frozenset(
    {"llama", "qwen3", "qwen3moe", "gemma4", "gpt-oss", "minimax-m2"}
)


def _bind(names: Sequence[str], argtypes: list[Any], restype: Any) -> Any:
    """The first of ``names`` that libllama exports, typed; None where none is."""
    for name in names:
        function = getattr(llama_cpp.llama_cpp._lib, name, None)
        if function is not None:
            function.argtypes = argtypes
            function.restype = restype
            return function
    return None


_context = llama_cpp.llama_context_p_ctypes
_model = llama_cpp.llama_model_p_ctypes
# set_layer_input(ctx, layer, on): the target hands out ``layer``'s input for every row
# it decodes; get_layer_input(ctx, layer): those rows, n_embd floats each (None where
# this build exports neither name: see eagle3_unavailable).
set_layer_input = _bind(
    ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb"),
    [_context, ctypes.c_uint32, ctypes.c_bool],
    None,
)
get_layer_input = _bind(
    ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj"),
    [_context, ctypes.c_uint32],
    ctypes.POINTER(ctypes.c_float),
)
_target_layer_ids = _bind(
    ("llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model"),
    [_model],
    ctypes.POINTER(ctypes.c_int32),
)
_target_layer_count = _bind(
    ("llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model"),
    [_model],
    ctypes.c_uint32,
)


def eagle3_unavailable() -> str | None:
    """Why this libllama cannot run EAGLE-3 heads (None: it can)."""
    bound = (set_layer_input, get_layer_input, _target_layer_ids, _target_layer_count)
    if all(function is not None for function in bound):
        return None
    return (
        "this llama.cpp build does not export the functions an EAGLE-3 head needs "
        "(llama_set_embeddings_layer_inp, llama_get_embeddings_layer_inp, "
        "llama_model_target_layer_ids); install llama-cpp-python 0.3.36 or later"
    )


def model_metadata(model: Any, key: str) -> str | None:
    """A GGUF metadata value of a loaded model, as text (None: the file has no such key)."""
    buffer = ctypes.create_string_buffer(256)
    length = llama_cpp.llama_model_meta_val_str(model, key.encode("utf-8"), buffer, 256)
    return buffer.value.decode("utf-8", errors="replace") if length >= 0 else None


def load_eagle3_weights(path: Path, target: Any, target_name: str, *, gpu_layers: int) -> Any:
    """Load an EAGLE-3 head's GGUF for ``target`` (this machine's devices alone); the
    caller owns the weights. Refused, with the reason, when the build cannot run it,
    the file is no EAGLE-3 head, or it was trained for another target (hidden size,
    vocabulary, or layers the target does not have)."""
    return load_head_weights(path, target, target_name, "an EAGLE-3 head", _mismatch, gpu_layers)


def load_head_weights(
    path: Path,
    target: Any,
    target_name: str,
    kind: str,
    mismatch: Callable[[Any, Any], str | None],
    gpu_layers: int,
) -> Any:
    """Load the head (``kind``, e.g. "an EAGLE-3 head") in ``path`` for ``target``,
    refused with the reason ``mismatch(weights, target)`` gives (None: it fits)."""
    reason = eagle3_unavailable()
    if reason is not None:
        raise ModelLoadError(f"{path.name}: {reason}")
    check_gguf_file(path)
    params = llama_cpp.llama_model_default_params()
    local_placement(gpu_layers).apply(params)
    weights = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not weights:
        raise ModelLoadError(f"llama.cpp could not load {kind} from {path}")
    try:
        problem = mismatch(weights, target)
    except BaseException:
        llama_cpp.llama_model_free(weights)
        raise
    if problem is not None:
        llama_cpp.llama_model_free(weights)
        raise ModelLoadError(f"{path.name} is not {kind} for {target_name}: {problem}")
    return weights


def head_layer_ids(weights: Any) -> list[int]:
    """The target layers whose inputs the head reads."""
    count = int(_target_layer_count(weights))
    pointer = _target_layer_ids(weights)
    return [int(pointer[index]) for index in range(count)] if pointer else []


def _mismatch(weights: Any, target: Any) -> str | None:
    """What makes ``weights`` unfit to draft for ``target`` (None: nothing)."""
    if model_metadata(weights, "general.architecture") != "eagle3":
        return "its architecture is not eagle3"
    target_embd = int(llama_cpp.llama_model_n_embd(target))
    hidden = model_metadata(weights, "eagle3.target_hidden_size")
    if hidden is None or int(hidden) != target_embd:
        return f"it reads a hidden size of {hidden}, the target's is {target_embd}"
    target_layers = int(llama_cpp.llama_model_n_layer(target))
    layer_ids = head_layer_ids(weights)
    if len(layer_ids) != 3 or not all(0 <= layer < target_layers for layer in layer_ids):
        return f"it reads layers {layer_ids}, the target has layers 0..{target_layers - 1}"
    return target_mismatch(weights, target)


def target_mismatch(weights: Any, target: Any) -> str | None:
    """What keeps a target from feeding a head that reads its layer inputs: an
    architecture whose graph does not hand them out, or another vocabulary."""
    architecture = model_metadata(target, "general.architecture")
    if architecture not in LAYER_INPUT_ARCHITECTURES:
        return (
            f"llama.cpp cannot hand out a {architecture} target's layer inputs "
            f"(it can for {', '.join(sorted(LAYER_INPUT_ARCHITECTURES))})"
        )
    return _vocabulary_mismatch(
        llama_cpp.llama_model_get_vocab(weights), llama_cpp.llama_model_get_vocab(target)
    )


def _vocabulary_mismatch(head: Any, target: Any) -> str | None:
    """Where the head's vocabulary is not the target's (None: it is the same).

    A head reads the target's token embeddings and its rows index the target's
    vocabulary, so the rule is stricter than a draft model's (backends/pair_check.py,
    which allows padding): the same size, special tokens and text for every id.
    """
    head_size = int(llama_cpp.llama_vocab_n_tokens(head))
    target_size = int(llama_cpp.llama_vocab_n_tokens(target))
    if head_size != target_size:
        return f"its vocabulary has {head_size} tokens, the target's {target_size}"
    head_facts, target_facts = vocab_facts(head, head_size), vocab_facts(target, target_size)
    if head_facts != target_facts:
        return f"its vocabulary differs ({head_facts} in the head, {target_facts} in the target)"
    for token in range(head_size):
        head_text, target_text = vocab_token_text(head, token), vocab_token_text(target, token)
        if head_text != target_text:
            return (
                f"its vocabulary differs at token {token} ({head_text!r} in the head, "
                f"{target_text!r} in the target)"
            )
    return None
