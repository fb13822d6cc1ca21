"""The draft heads a llama.cpp target feeds: its own MTP head (``mtp``), an EAGLE-3 head
(``eagle3``) or a DFlash/DSpark block head (``dflash``) from a separate file. One at a
time: each decode of the target hands its hidden states to the head, and each rollback
cuts the head back with it (what they share: ``head_base``).

Mixed into ``LlamaCppModel``, which sets the attributes declared here and calls
``self._head.target_decoded`` / ``target_rolled_back`` from its decode and rollback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends.errors import BackendError, DecodeError
from backends.llamacpp.dflash import LlamaCppBlockHead
from backends.llamacpp.dflash_files import block_head_facts, load_dflash_weights
from backends.llamacpp.eagle3 import LlamaCppEagle3Head
from backends.llamacpp.eagle3_files import head_layer_ids, load_eagle3_weights
from backends.llamacpp.head_base import LlamaCppHead
from backends.llamacpp.library import llama_cpp
from backends.llamacpp.mtp import LlamaCppMtpHead, load_mtp_weights


class DraftHeads:
    """The head a llama.cpp target drafts with (see the module's docstring)."""

    _model: Any
    _context: Any
    _head: LlamaCppHead | None
    name: str
    n_ctx: int
    n_batch: int
    n_threads: int
    n_vocab: int
    mtp_layers: int
    gpu_offload: bool
    recurrent: bool
    parallel: int
    one_cache: bool

    def _live_context(self) -> Any:
        if not self._context:
            raise DecodeError(f"{self.name} was closed; load the model again to use it")
        return self._context

    def mtp_head(self) -> LlamaCppMtpHead | None:
        """The model's own multi-token-prediction head (None: the file has none)."""
        if self._head is None and self.mtp_layers > 0:
            self._head = self._new_mtp_head(self._model)
        return self._head if isinstance(self._head, LlamaCppMtpHead) else None

    def attach_mtp_file(self, path: str | Path) -> LlamaCppMtpHead:
        """Draft with the MTP head in a separate GGUF (as some publishers ship it)."""
        weights = load_mtp_weights(
            Path(path), self._model, self.name, gpu_layers=self._head_gpu_layers()
        )
        self._close_head()
        self._head = self._new_mtp_head(weights, owns_weights=True)
        return self._head

    def attach_eagle3_file(self, path: str | Path) -> LlamaCppEagle3Head:
        """Draft with an EAGLE-3 head (llama.cpp's ``eagle3`` GGUF) trained for this model.

        Refused with the reason for a head trained for another target (hidden size,
        vocabulary, layers), a target whose architecture does not hand out its layers'
        inputs, and a hybrid target. A context of several sequences gets one head
        context with a head sequence per target sequence (``sequence_head``).
        """
        self._refuse_layer_input_head("an EAGLE-3 head")
        weights = load_eagle3_weights(
            Path(path), self._model, self.name, gpu_layers=self._head_gpu_layers()
        )
        self._close_head()
        self._head = LlamaCppEagle3Head(
            self._live_context(),
            weights,
            layer_ids=head_layer_ids(weights),
            target_embd=int(llama_cpp.llama_model_n_embd(self._model)),
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            threads=self.n_threads,
            n_vocab=self.n_vocab,
            n_seq=self.parallel,
        )
        return self._head

    def attach_dflash_file(self, path: str | Path) -> LlamaCppBlockHead:
        """Draft with a DFlash or DSpark head (llama.cpp's ``dflash`` GGUF) trained for
        this model; refused as :meth:`attach_eagle3_file` refuses an EAGLE-3 head."""
        self._refuse_layer_input_head("a DFlash or DSpark head")
        weights = load_dflash_weights(
            Path(path), self._model, self.name, gpu_layers=self._head_gpu_layers()
        )
        try:
            facts = block_head_facts(Path(path), weights)
        except BaseException:
            llama_cpp.llama_model_free(weights)
            raise
        self._close_head()
        self._head = LlamaCppBlockHead(
            self._live_context(),
            weights,
            facts,
            layer_ids=head_layer_ids(weights),
            target_embd=int(llama_cpp.llama_model_n_embd(self._model)),
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            threads=self.n_threads,
            n_vocab=self.n_vocab,
            n_seq=self.parallel,
        )
        return self._head

    def _refuse_layer_input_head(self, head: str) -> None:
        """A head that reads the target's layer inputs follows attention-only sequences."""
        if self.recurrent:
            raise BackendError(
                f"{self.name} keeps a recurrent state; {head} drafts for "
                "attention-only targets here. Use --drafter mtp, ngram or none."
            )

    def _head_gpu_layers(self) -> int:
        return 999 if self.gpu_offload else 0

    def _new_mtp_head(self, weights: Any, *, owns_weights: bool = False) -> LlamaCppMtpHead:
        return LlamaCppMtpHead(
            self._live_context(),
            weights,
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            threads=self.n_threads,
            n_vocab=self.n_vocab,
            owns_weights=owns_weights,
            n_seq=self.parallel,
            # As the target's cache is laid out: Gemma 4's assistant shares it.
            one_cache=self.one_cache,
        )

    def _close_head(self) -> None:
        if self._head is not None:
            self._head.close()
            self._head = None
