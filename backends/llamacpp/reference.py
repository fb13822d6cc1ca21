"""llama-cpp-python's own high-level ``Llama``, kept only as bench's outside yardstick."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from pathlib import Path

from backends.llamacpp.ggml_devices import supports_gpu_offload
from backends.llamacpp.library import (
    ensure_backend,
    llama_cpp,
    log_callback,
    physical_cores,
)


class LlamaCppReference:
    """llama-cpp-python's own high-level decoding, as an outside yardstick for bench.

    ``prompt_lookup`` turns on its ``LlamaPromptLookupDecoding`` (n-gram drafting);
    without it this is its plain streaming completion. Greedy, same threads as ours.
    Its draft path keeps logits for the whole context, so n_batch = n_ctx here.
    """

    def __init__(self, path: str | Path, *, n_ctx: int = 2048, prompt_lookup: bool = False):
        ensure_backend()
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        threads = physical_cores()
        self.name = "llama-cpp-python prompt lookup" if prompt_lookup else "llama-cpp-python"
        self._llama = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=n_ctx if prompt_lookup else 512,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=-1 if supports_gpu_offload() else 0,
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10) if prompt_lookup else None,
            verbose=False,
        )
        # Llama() installs its own log callback; keep llama.cpp quiet for the TUI.
        llama_cpp.llama_log_set(log_callback, ctypes.c_void_p(0))

    def decode_speed(self, prompt_tokens: Sequence[int], max_tokens: int) -> tuple[int, float]:
        """Stream a greedy completion; return (tokens, seconds from first to last token).

        The first token's time includes prefill, so speed is measured over the rest.
        """
        self._llama.reset()
        first = last = None
        count = 0
        for _chunk in self._llama.create_completion(
            list(prompt_tokens), max_tokens=max_tokens, temperature=0.0, stream=True
        ):
            now = time.perf_counter()
            count += 1
            if first is None:
                first = now
            last = now
        if first is None or last is None or count < 2:
            return count, 0.0
        return count - 1, last - first

    def close(self) -> None:
        """Free the model."""
        self._llama.close()
