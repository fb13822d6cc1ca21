"""Which drafters this llama.cpp build runs, found in the library itself.

A draft model and n-gram lookup need nothing beyond a forward pass. A head needs
functions that only some builds of libllama export: MTP the nextn ones that
llama-cpp-python's ``llama_cpp_ext`` binds at import, EAGLE-3 the layer-input ones that
``eagle3_files`` binds by name. ``draftpen doctor`` asks here, in the runtime check's
child process (so a library that crashes on this CPU never takes doctor with it).

DFlash and DSpark heads read the layer inputs too, and load as llama.cpp's ``dflash``
architecture (``dflash_files``).
"""

from __future__ import annotations

import importlib

from backends.llamacpp.dflash_files import dflash_unavailable
from backends.llamacpp.eagle3_files import eagle3_unavailable
from backends.llamacpp.library import llama_cpp

DRAFTERS = ("model", "ngram", "mtp", "eagle3", "dflash", "dspark")
"""Every drafter a llama.cpp pair may name, in the order doctor lists them."""


def drafter_support() -> dict[str, str | None]:
    """Each drafter of :data:`DRAFTERS`, with why this build cannot run it (None: it can)."""
    dflash = dflash_unavailable()
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
