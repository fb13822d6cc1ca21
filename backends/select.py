"""Which runtime runs a model on this machine, and loading a model with it.

For now every model runs on llama.cpp, which uses the GPU when its build supports
offload (CUDA, Metal) and the CPU otherwise. The runtime module is imported only
when a model is loaded, so this module imports anywhere.
"""

from __future__ import annotations

from pathlib import Path

from backends.base import Model
from backends.errors import RuntimeUnavailableError
from backends.pair_check import Vocabulary

RUNTIMES = ("llamacpp",)


def choose_runtime(requested: str | None = None) -> str:
    """The runtime to use: the one requested, or the best one for this machine."""
    if requested is None or requested == "auto":
        return "llamacpp"
    if requested not in RUNTIMES:
        raise RuntimeUnavailableError(
            f"Unknown runtime {requested!r}; choose one of: {', '.join(RUNTIMES)}."
        )
    return requested


def load_vocabulary(path: Path, *, runtime: str) -> Vocabulary | None:
    """A model's tokenizer alone, for the pair check; ``None`` where the runtime has no such load.

    The caller closes it (``close()``) when done.
    """
    if runtime == "llamacpp":
        from backends.llamacpp import LlamaCppVocabulary

        return LlamaCppVocabulary(path)
    return None


def load_model(path: Path, *, runtime: str, n_ctx: int, name: str | None = None) -> Model:
    """Load one model file with ``runtime``."""
    if runtime == "llamacpp":
        from backends.llamacpp import LlamaCppModel

        return LlamaCppModel(path, n_ctx=n_ctx, name=name)
    raise RuntimeUnavailableError(f"Runtime {runtime!r} is not available in this build.")
