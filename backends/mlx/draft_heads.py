"""The draft head an MLX target feeds: an EAGLE-3 head (``eagle3``) or a DFlash head
(``dflash``), each from its publisher's directory, through mlx-vlm (backends/mlx/heads.py).

One at a time: attaching a head makes the target capture the outputs of the layers the
head reads (:class:`~backends.mlx.layer_capture.LayerCapture`); each forward of the target
hands them to the head, and each rollback cuts the head back with it. A model loaded
with ``parallel`` attaches its head before its sequences' views are made; each view
then drafts with a state of the head of its own (backends/sequence_head.py). Mixed into
``MlxModel``, which sets the attributes declared here and calls :meth:`_feed_head`,
``_head.target_rolled_back`` and ``_head.target_replaced``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from backends.errors import BackendError
from backends.mlx.head_files import HEAD_NAMES, TargetShape, load_head
from backends.mlx.heads import MlxBlockHead, MlxEagle3Head, MlxHead
from backends.mlx.layer_capture import LayerCapture, model_layers


class MlxDraftHeads:
    """The head an MLX target drafts with (see the module's docstring)."""

    _model: Any
    _head: MlxHead | None
    _head_capture: LayerCapture | None
    name: str
    n_vocab: int
    parallel: int
    recurrent: bool
    device_sampling: bool
    cpu_float32: bool
    splits_layers = False  # a share of a target split across ranks (SplitMlxModel)

    def attach_eagle3_file(self, path: str | Path) -> MlxEagle3Head:
        """Draft with an EAGLE-3 head (its Hugging Face directory, speculators' format)
        trained for this model; one trained for another is refused with the reason."""
        loaded = self._load_head(Path(path), "eagle3")
        head = MlxEagle3Head(
            loaded, self._model, n_vocab=self.n_vocab, device_sampling=self.device_sampling
        )
        self._use_head(head)
        return head

    def attach_dflash_file(self, path: str | Path) -> MlxBlockHead:
        """Draft with a DFlash head (its Hugging Face directory) trained for this model;
        refused as :meth:`attach_eagle3_file` refuses an EAGLE-3 head."""
        loaded = self._load_head(Path(path), "dflash")
        head = MlxBlockHead(loaded, self._model, device_sampling=self.device_sampling)
        self._use_head(head)
        return head

    def _load_head(self, path: Path, wanted: str) -> Any:
        what = HEAD_NAMES[wanted]
        if self.recurrent:
            raise BackendError(
                f"{self.name} keeps a recurrent state; {what} drafts for attention-only "
                "targets here. Use --drafter ngram or none."
            )
        if self.splits_layers:
            raise BackendError(
                f"{self.name} is split across machines, and {what} reads layers other ranks "
                "hold. Draft with --drafter ngram or model, or run the target on one machine."
            )
        args = getattr(self._model, "args", None)
        shape = TargetShape(
            name=self.name,
            hidden_size=int(getattr(args, "hidden_size", 0)),
            n_vocab=self.n_vocab,
            n_layers=len(model_layers(self._model)),
        )
        loaded = load_head(path, wanted, shape)
        if self.cpu_float32:
            loaded.model.set_dtype(mx.float32)  # as the target (see MlxModel.__init__)
        # Loaded now, on this thread, as the target's weights are.
        mx.eval(loaded.model.parameters())
        return loaded

    def _use_head(self, head: MlxHead) -> None:
        self._close_head()
        self._head_capture = LayerCapture(self._model, head.capture_layer_ids)
        self._head = head

    def _feed_head(self, start: int, tokens: Sequence[int]) -> None:
        """The target's forward of ``tokens`` from ``start`` ran: hand the head its rows."""
        if self._head is None or self._head_capture is None:
            return
        rows = self._head_capture.take()
        if rows is not None:
            self._head.target_decoded(start, tokens, rows)

    def _close_head(self) -> None:
        if self._head_capture is not None:
            self._head_capture.remove()
        self._head_capture = None
        self._head = None
