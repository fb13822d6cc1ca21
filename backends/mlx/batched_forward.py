"""Several sequences' tokens through one mlx-lm forward, each over its own KV cache.

mlx-lm's ``BatchGenerator`` shows that the runtime batches: its ``BatchKVCache`` holds
every sequence left-padded in one buffer, all of them advancing together. Ours cannot
advance together: each sequence drafts its own K, and rejects and rolls back on its
own. So each sequence keeps its own prompt cache (mlx-lm's ``KVCache`` per layer: its
rollback, saved states and state files stay as they are alone), and one forward
carries them all:

- The tokens go in as a ``[B, L]`` batch, each sequence's row right-padded to the
  longest. Every weight-bound part of the model (projections, MLP, the output layer)
  then reads its weights once for all the sequences, which is what batching buys.
- Each layer's cache is a :class:`GatheredLayer`: its ``offset`` is the sequences'
  positions (an array, so RoPE places each row where it belongs, as it does for
  ``BatchKVCache``), and ``update_and_fetch`` writes each row's real tokens into its
  own sequence's cache, never the padding.
- Attention runs per sequence (:func:`_per_sequence_attention`), with exactly the call
  the sequence makes alone: its queries, its own keys and values, its own causal mask.
  So no key is padded, no mask array is built, and nothing is copied between caches.
  mlx-lm's attention call is a module global of each family's model file; it is
  wrapped (once, :func:`gathers_attention`) to send a gathered layer's call here and
  every other call on, unchanged.

Whether a row then rounds as it does alone depends only on the matmuls' kernels for
B*L rows (attention is the same call); ``sequences.py`` checks that on the loaded model.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models import base as mlx_base
from mlx_lm.models.cache import KVCache

# Marks the wrapper, so a model file is wrapped once however many models load.
_WRAPPED = "_draftpen_gathers"


class GatheredLayer:
    """One layer's caches of the sequences in a batched forward, seen as one cache."""

    def __init__(self, layers: Sequence[Any], lengths: Sequence[int]) -> None:
        self.layers = list(layers)
        self.lengths = list(lengths)  # each row's real tokens; the rest is padding
        self.offset = mx.array([int(layer.offset) for layer in layers])
        self._masks = [
            mlx_base.create_attention_mask(_ShapeOnly(length), layer)
            for layer, length in zip(layers, lengths, strict=True)
        ]
        self._fetched: list[tuple[Any, Any]] = []

    def make_mask(self, *args: Any, **kwargs: Any) -> None:
        """No batch mask: attention runs per sequence, each with its own."""
        return None

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        """Write each row's real keys and values into its own sequence's cache."""
        self._fetched = []
        for row, (layer, length) in enumerate(zip(self.layers, self.lengths, strict=True)):
            mine = (slice(row, row + 1), slice(None), slice(0, length))
            self._fetched.append(layer.update_and_fetch(keys[mine], values[mine]))
        return keys, values  # unused: the attention call asks this layer for each row's


class _ShapeOnly:
    """Stands for hidden states of ``length`` tokens where only the shape is read."""

    def __init__(self, length: int) -> None:
        self.shape = (1, length, 0)


def _per_sequence_attention(
    original: Any, queries: Any, layer: GatheredLayer, scale: float, sinks: Any
) -> Any:
    """Each row's attention exactly as alone, padded back into one ``[B, H, L, D]``."""
    width = int(queries.shape[2])
    outputs = []
    for row, (cache, length) in enumerate(zip(layer.layers, layer.lengths, strict=True)):
        keys, values = layer._fetched[row]
        out = original(
            queries[row : row + 1, :, :length],
            keys,
            values,
            cache=cache,
            scale=scale,
            mask=layer._masks[row],
            sinks=sinks,
        )
        if length < width:
            pad = mx.zeros((1, out.shape[1], width - length, out.shape[3]), dtype=out.dtype)
            out = mx.concatenate([out, pad], axis=2)
        outputs.append(out)
    return outputs[0] if len(outputs) == 1 else mx.concatenate(outputs, axis=0)


def _wrap(original: Any) -> Any:
    def attention(
        queries: Any,
        keys: Any,
        values: Any,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: Any = None,
    ) -> Any:
        if isinstance(cache, GatheredLayer):
            return _per_sequence_attention(original, queries, cache, scale, sinks)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    setattr(attention, _WRAPPED, True)
    return attention


def gathers_attention(model: Any) -> bool:
    """Make ``model``'s attention run per sequence for a gathered layer (its family's
    model files wrapped once); False where a family computes attention some other way
    (then its sequences' forwards run in turn)."""
    files = {type(module).__module__ for _, module in model.named_modules()}
    found = False
    for name in files:
        module = sys.modules.get(name)
        attention = getattr(module, "scaled_dot_product_attention", None)
        if attention is None:
            continue
        if not getattr(attention, _WRAPPED, False):
            if attention is not mlx_base.scaled_dot_product_attention:
                return False  # a family's own attention: not ours to reroute
            module.scaled_dot_product_attention = _wrap(attention)  # type: ignore[union-attr]
        found = True
    return found


def forward_together(
    model: Any, caches: Sequence[Sequence[Any]], tokens: Sequence[Sequence[int]]
) -> Any:
    """One forward of each sequence's ``tokens`` over its own prompt cache (``caches``:
    one list of layers per sequence); the lazy ``[B, L, vocab]`` logits, row ``b``'s
    first ``len(tokens[b])`` positions real. Caller evaluates (and the caches)."""
    width = max(len(row) for row in tokens)
    padded = [list(row) + [0] * (width - len(row)) for row in tokens]
    lengths = [len(row) for row in tokens]
    if not all(isinstance(layer, KVCache) for layers in caches for layer in layers):
        raise TypeError("only plain KV caches are gathered")
    gathered = [GatheredLayer(layers, lengths) for layers in zip(*caches, strict=True)]
    return model(mx.array(padded, dtype=mx.int32), cache=gathered)
