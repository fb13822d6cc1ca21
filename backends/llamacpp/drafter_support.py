"""Which drafters this llama.cpp build runs, found in the library itself.

A draft model and n-gram lookup need nothing beyond a forward pass. A head needs
functions that only some builds of libllama export: MTP the nextn ones that
llama-cpp-python's ``llama_cpp_ext`` binds at import, EAGLE-3 the layer-input ones that
``eagle3_files`` binds by name. ``draftpen doctor`` asks here, in the runtime check's
child process (so a library that crashes on this CPU never takes doctor with it).

DFlash and DSpark heads (llama.cpp's ``dflash`` architecture) are answered by the module
that binds their functions, once it exists (:data:`DFLASH_MODULE`, whose
``dflash_unavailable()`` says why this build cannot run them, as ``eagle3_files`` does).
"""

from __future__ import annotations

import importlib

from backends.llamacpp.eagle3_files import eagle3_unavailable
from backends.llamacpp.library import llama_cpp

DRAFTERS = ("model", "ngram", "mtp", "eagle3", "dflash", "dspark")
"""Every drafter a llama.cpp pair may name, in the order doctor lists them."""

# The hook for the DFlash drafter (issue 54 part 2): the module that binds llama.cpp's
# DFlash functions and says, in dflash_unavailable(), why a build cannot run them.
DFLASH_MODULE = "backends.llamacpp.dflash_files"
# Exported by a libllama that knows the dflash architecture (src/llama-ext.h).
_DFLASH_SYMBOLS = (
    "llama_model_dflash_selector_top_k",
    "_Z33llama_model_dflash_selector_top_kPK11llama_model",
)


def drafter_support() -> dict[str, str | None]:
    """Each drafter of :data:`DRAFTERS`, with why this build cannot run it (None: it can)."""
    dflash = _dflash_unavailable()
    return {
        "model": None,
        "ngram": None,
        "mtp": _mtp_unavailable(),
        "eagle3": eagle3_unavailable(),
        "dflash": dflash,
        "dspark": dflash,  # a DSpark head is a dflash GGUF with a Markov head beside it
    }


def _mtp_unavailable() -> str | None:
    """Why this build cannot run an MTP head (None: it can)."""
    try:
        # Binds the nextn functions when imported; a build without them raises there.
        importlib.import_module("llama_cpp.llama_cpp_ext")
    except (ImportError, AttributeError) as error:
        return f"this llama.cpp build lacks the nextn functions an MTP head needs ({error})"
    if not hasattr(llama_cpp, "llama_model_n_layer_nextn") or not hasattr(
        llama_cpp, "LLAMA_CONTEXT_TYPE_MTP"
    ):
        return "this llama-cpp-python has no MTP context type; install 0.3.36 or later"
    return None


def _dflash_unavailable() -> str | None:
    """Why this build cannot run a DFlash or DSpark head (None: it can)."""
    try:
        module = importlib.import_module(DFLASH_MODULE)
    except ModuleNotFoundError as error:
        if error.name != DFLASH_MODULE:
            raise
        library = llama_cpp.llama_cpp._lib
        knows = any(getattr(library, name, None) is not None for name in _DFLASH_SYMBOLS)
        where = (
            "this libllama has llama.cpp's dflash architecture"
            if knows
            else "nor does this libllama export llama.cpp's dflash functions"
        )
        return f"this draftpen has no DFlash drafter yet ({where})"
    reason: str | None = module.dflash_unavailable()
    return reason
