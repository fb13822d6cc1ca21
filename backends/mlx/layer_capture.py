"""The outputs of chosen layers of an mlx-lm model, captured as it runs.

A draft head (EAGLE-3, DFlash) reads, for every position the target evaluates, the
hidden states some of the target's layers wrote there. mlx-lm's model classes hand out
only their logits, so each chosen layer's class is swapped for a subclass of it that
records what the layer returns and returns it unchanged: the model's own forward, its
masks and caches run as before, and the layer keeps its parameters' names (a wrapper
module would rename them). Removing the capture swaps the classes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

# One recording subclass per layer class and capture: the capture it records into is
# a class attribute (an instance attribute of an mlx Module would join its parameters).
_RECORDER_ATTRIBUTE = "_draftpen_capture"


def model_layers(model: Any) -> list[Any]:
    """The decoder layers of an mlx-lm model, in order (the list the model iterates)."""
    for owner in (getattr(model, "model", None), model, getattr(model, "language_model", None)):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, list) and layers:
            return layers
    raise ValueError(f"{type(model).__name__} has no list of decoder layers to read")


class LayerCapture:
    """Records the outputs of ``layer_ids`` (in that order, repeats allowed) at each
    forward of ``model``; :meth:`take` hands them out concatenated per position."""

    def __init__(self, model: Any, layer_ids: Sequence[int]) -> None:
        self.layer_ids = tuple(int(layer) for layer in layer_ids)
        self._layers = model_layers(model)
        count = len(self._layers)
        if not self.layer_ids or not all(0 <= layer < count for layer in self.layer_ids):
            raise ValueError(
                f"layers {list(self.layer_ids)} are not all among the model's {count} layers"
            )
        self._outputs: dict[int, mx.array] = {}
        self._swapped: dict[int, type] = {}
        for layer_id in sorted(set(self.layer_ids)):
            layer = self._layers[layer_id]
            original = type(layer)
            recorder = type(
                original.__name__,
                (original,),
                {"__call__": _recording_call(original, layer_id), _RECORDER_ATTRIBUTE: self},
            )
            layer.__class__ = recorder
            self._swapped[layer_id] = original

    def record(self, layer_id: int, output: mx.array) -> None:
        """A captured layer returned ``output`` (called by the layer)."""
        self._outputs[layer_id] = output

    def take(self) -> mx.array | None:
        """The last forward's captured outputs, ``(batch, positions, layers * width)``
        (lazy), and forget them; None where no forward ran since the last take."""
        if any(layer_id not in self._outputs for layer_id in self.layer_ids):
            self._outputs.clear()
            return None
        taken = mx.concatenate([self._outputs[layer_id] for layer_id in self.layer_ids], axis=-1)
        self._outputs.clear()
        return taken

    def remove(self) -> None:
        """Give the layers their own classes back."""
        for layer_id, original in self._swapped.items():
            self._layers[layer_id].__class__ = original
        self._swapped.clear()
        self._outputs.clear()


def _recording_call(original: type, layer_id: int) -> Any:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = original.__call__(self, *args, **kwargs)
        # Layers that return more than their hidden state put it first.
        hidden = output[0] if isinstance(output, tuple) else output
        getattr(type(self), _RECORDER_ATTRIBUTE).record(layer_id, hidden)
        return output

    return __call__
