"""An MLX model's saved prompt cache in a file, and what must match to load it.

A saved state (``MlxModel.save_state``) is a deep copy of mlx-lm's prompt cache: one
object per layer whose ``state`` is a small tree of arrays and scalars (a ``KVCache``:
keys, values, offset; a recurrent ``ArraysCache``: its list of arrays). It is written
as a JSON header (each layer's class and state tree, each array's dtype and shape),
then the arrays' bytes in C order. A KV layer's buffers are written only up to its
offset: mlx-lm grows them in steps of 256 positions, and the rest is zeros or
positions a rollback dropped.

``write_state`` runs on the prefix cache's writer thread. It reads the bytes of arrays
``save_state`` has already evaluated, through the buffer protocol, which for an
evaluated array only checks that it is ready: nothing is computed or scheduled
there. Everything that builds arrays (``read_state``) runs on the runtime's thread.

A state computed by other weights, another mlx or mlx-lm, another device or dtype is
not one this model would have computed, so its identity lists all of them
(``backends/caches/prefix_keys.py`` hashes it into the files' key).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

from backends.base import SequenceState

FORMAT = 1
# The layers whose arrays hold one row per position on their second-to-last axis, in a
# buffer longer than their ``offset``: written (and checked) up to the offset.
POSITIONAL = (KVCache, QuantizedKVCache)
MAX_HEADER_BYTES = 16 << 20
# Arrays are read in slices: one readinto of a large buffer may return short.
READ_SLICE_BYTES = 64 << 20
_LENGTH = struct.Struct("<I")


class MlxStateFiles:
    """Saved prompt caches to and from files (mixed into ``MlxModel``, which sets
    ``path``, ``name``, ``prefill_chunk`` and ``_model``)."""

    path: Path
    name: str
    prefill_chunk: int
    _model: Any
    _state_layout: list[Any] | None = None  # what a state of this model looks like
    _state_owner: object  # whose states these are (a parallel model's views share it)

    def state_identity(self) -> Mapping[str, object]:
        """What a state saved by another process must match to be loaded here."""
        device = mx.default_device()
        info = mx.device_info() if hasattr(mx, "device_info") else {}
        return {
            "runtime": "mlx",
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
            "weights": str(self.path),  # fingerprinted by the cache (prefix_keys.file_identity)
            "device": "gpu" if device.type == mx.DeviceType.gpu else "cpu",
            "device_kind": {key: info.get(key) for key in ("architecture", "device_name")},
            # The computation's dtypes (float32 on a CPU by default, else the file's).
            "dtypes": sorted({_dtype_name(value.dtype) for _, value in self._parameters()}),
            "cache": [_layer_kind(layer) for layer in make_prompt_cache(self._model)],
            "prefill_chunk": self.prefill_chunk,  # where a prompt's batches split
        }

    def write_state(self, state: SequenceState, file: BinaryIO) -> None:
        """Write a saved state's layers (touches only the evaluated copy, never the runtime)."""
        layers, arrays = _encode_layers(state.payload)
        # mlx-lm 0.32's ``state`` getters return a layer's own (evaluated) arrays. One
        # that built new ones (older ones sliced the KV buffers) would have them
        # computed on this thread: refuse it rather than race the runtime.
        again = [array for array, _ in _encode_layers(state.payload)[1]]
        if [id(array) for array, _ in arrays] != [id(array) for array in again]:
            raise ValueError("this mlx-lm builds cache states anew; they are not written")
        header = json.dumps(
            {"format": FORMAT, "layers": layers, "arrays": [_spec(a, cut) for a, cut in arrays]}
        ).encode()
        file.write(_LENGTH.pack(len(header)) + header)
        for array, cut in arrays:
            _write_array(file, array, cut)

    def read_state(self, tokens: Sequence[int], file: BinaryIO, nbytes: int) -> SequenceState:
        """A state written by ``write_state``, for ``restore_state``; ValueError if it is
        not one this model's cache could hold (checked before its arrays are read)."""
        header, used = _read_header(file, nbytes)
        specs, layers = header.get("arrays"), header.get("layers")
        if header.get("format") != FORMAT or not isinstance(specs, list):
            raise ValueError("the state is in an unknown format")
        kinds = [type(layer) for layer in make_prompt_cache(self._model)]
        if not isinstance(layers, list) or len(layers) != len(kinds):
            raise ValueError(f"the state does not have {self.name}'s {len(kinds)} cache layers")
        checked = [_checked_spec(spec) for spec in specs]
        described = used + sum(math.prod(shape) * dtype.size for dtype, shape in checked)
        if described != nbytes:
            raise ValueError(f"the state holds {nbytes} bytes, its header describes {described}")
        layout = self._layout()
        for index, (entry, kind) in enumerate(zip(layers, kinds, strict=True)):
            _check_layer(index, entry, kind, specs, None if layout is None else layout[index])
        arrays = [_read_array(file, dtype, shape) for dtype, shape in checked]
        cache = [
            _rebuilt(index, kind, entry["state"], arrays, len(tokens))
            for index, (entry, kind) in enumerate(zip(layers, kinds, strict=True))
        ]
        mx.eval(arrays)
        return SequenceState(tuple(tokens), nbytes, cache, owner=self._state_owner)

    def _parameters(self) -> list[tuple[str, Any]]:
        return list(tree_flatten(self._model.parameters()))

    def _layout(self) -> list[Any] | None:
        """Each cache layer's signature (its state's structure, array dtypes and shapes),
        from a forward of one token that is built but never evaluated (MLX knows an
        array's shape without computing it). None where the model cannot be probed so."""
        if self._state_layout is None:
            probe = make_prompt_cache(self._model)
            try:
                self._model(mx.array([[0]], dtype=mx.int32), cache=probe)
            except Exception:  # a model that evaluates inside its forward: no shape check
                return None
            layers, arrays = _encode_layers(probe)
            specs = [_spec(array, cut) for array, cut in arrays]
            self._state_layout = [
                _signature(type(layer), entry["state"], specs)
                for layer, entry in zip(probe, layers, strict=True)
            ]
        return self._state_layout


def _dtype_name(dtype: Any) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _check_layer(index: int, entry: Any, kind: type, specs: list[Any], layout: Any) -> None:
    """ValueError unless a state's layer ``index`` is this model's (its class, and where
    the model's ``layout`` is known, its arrays' dtypes and shapes)."""
    saved = entry.get("class") if isinstance(entry, dict) else None
    if saved != kind.__name__ or "state" not in entry:
        raise ValueError(f"cache layer {index} is a {saved!r}, not this model's {kind.__name__}")
    if layout is not None and _signature(kind, entry["state"], specs) != layout:
        raise ValueError(f"cache layer {index}'s arrays do not have this model's shapes")


def _rebuilt(index: int, kind: Any, tree: Any, arrays: list[Any], positions: int) -> Any:
    """A cache layer of ``kind`` from its state read back."""
    try:
        layer = kind.from_state(_decode(tree, arrays))
    except (TypeError, AttributeError) as error:  # a state tree of another shape
        raise ValueError(f"cache layer {index} cannot be rebuilt ({error})") from error
    if isinstance(layer, POSITIONAL) and not _holds(layer, positions):
        raise ValueError(f"cache layer {index} does not hold {positions} positions")
    return layer


def _holds(layer: Any, positions: int) -> bool:
    """Whether a positional layer's offset and arrays hold exactly ``positions``."""
    arrays = [value for _, value in tree_flatten(layer.state) if isinstance(value, mx.array)]
    return layer.offset == positions and all(a.shape[-2] == positions for a in arrays)


def _layer_kind(layer: Any) -> str:
    """A layer's class, with a quantised KV cache's bits and group size."""
    bits = getattr(layer, "bits", None)
    name = type(layer).__name__
    return name if bits is None else f"{name}:{bits}b/{getattr(layer, 'group_size', '?')}"


# -- the state trees -----------------------------------------------------------


def _encode_layers(cache: Sequence[Any]) -> tuple[list[dict[str, Any]], list[tuple[Any, int]]]:
    """JSON for each layer (arrays replaced by their index), and the arrays with the
    length their positional axis is cut to (-1: written whole)."""
    arrays: list[tuple[Any, int]] = []
    layers = []
    for layer in cache:
        cut = int(layer.offset) if isinstance(layer, POSITIONAL) else -1
        layers.append({"class": type(layer).__name__, "state": _encode(layer.state, arrays, cut)})
    return layers, arrays


def _encode(tree: Any, arrays: list[tuple[Any, int]], cut: int) -> Any:
    if isinstance(tree, mx.array):
        arrays.append((tree, cut))
        return {"array": len(arrays) - 1}
    if isinstance(tree, tuple):
        return {"tuple": [_encode(item, arrays, cut) for item in tree]}
    if isinstance(tree, list):
        return [_encode(item, arrays, cut) for item in tree]
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    raise ValueError(f"a cache state holds a {type(tree).__name__}, which is not saved")


def _decode(tree: Any, arrays: list[Any]) -> Any:
    if isinstance(tree, dict) and set(tree) == {"array"}:
        index = tree["array"]
        if not isinstance(index, int) or not 0 <= index < len(arrays):
            raise ValueError("the state names an array it does not hold")
        return arrays[index]
    if isinstance(tree, dict) and set(tree) == {"tuple"} and isinstance(tree["tuple"], list):
        return tuple(_decode(item, arrays) for item in tree["tuple"])
    if isinstance(tree, list):
        return [_decode(item, arrays) for item in tree]
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    raise ValueError("the state's layers are damaged")


def _signature(kind: type, tree: Any, specs: list[Any]) -> Any:
    """A layer state's structure with its arrays' dtypes and shapes, and neither its
    scalars' values nor (in a positional layer) its arrays' lengths."""
    if isinstance(tree, dict) and set(tree) == {"array"}:
        index = tree["array"]
        if not isinstance(index, int) or not 0 <= index < len(specs):
            raise ValueError("the state names an array it does not hold")
        dtype, shape = specs[index]["dtype"], list(specs[index]["shape"])
        if issubclass(kind, POSITIONAL) and len(shape) >= 2:
            shape[-2] = None
        return ["array", dtype, shape]
    if isinstance(tree, dict) and set(tree) == {"tuple"}:
        return ["tuple", [_signature(kind, item, specs) for item in tree["tuple"]]]
    if isinstance(tree, list):
        return ["list", [_signature(kind, item, specs) for item in tree]]
    return type(tree).__name__


# -- the arrays' bytes -----------------------------------------------------------


def _spec(array: Any, cut: int) -> dict[str, Any]:
    shape = list(array.shape)
    if cut >= 0:
        if len(shape) < 2 or cut > shape[-2]:
            raise ValueError(f"a KV buffer of shape {shape} cannot hold {cut} positions")
        shape[-2] = cut
    return {"dtype": _dtype_name(array.dtype), "shape": shape}


def _checked_spec(spec: Any) -> tuple[Any, list[int]]:
    if not isinstance(spec, dict):
        raise ValueError("the state's array list is damaged")
    dtype = getattr(mx, str(spec.get("dtype")), None)
    shape = spec.get("shape")
    if not isinstance(dtype, mx.Dtype):
        raise ValueError(f"the state holds an unknown dtype {spec.get('dtype')!r}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError("the state's array shapes are damaged")
    return dtype, shape


def _write_array(file: BinaryIO, array: Any, cut: int) -> None:
    """Write an evaluated array's bytes in C order (a positional one up to ``cut``)."""
    if array.nbytes == 0:
        return
    view = memoryview(array)  # no copy; numpy has no bfloat16, so it is read as bytes
    data = view.cast("B") if view.c_contiguous else view.tobytes()
    raw = np.frombuffer(data, dtype=np.uint8)
    if cut < 0 or cut == array.shape[-2]:
        file.write(raw)
        return
    rows = raw.reshape(-1, array.shape[-2], array.shape[-1] * array.itemsize)
    for row in rows:  # each (batch, head) row's first ``cut`` positions are contiguous
        file.write(row[:cut])


def _read_header(file: BinaryIO, nbytes: int) -> tuple[dict[str, Any], int]:
    start = file.read(_LENGTH.size)
    if len(start) != _LENGTH.size:
        raise ValueError("the state is empty")
    (length,) = _LENGTH.unpack(start)
    if length > min(MAX_HEADER_BYTES, nbytes - _LENGTH.size):
        raise ValueError("the state's header is damaged")
    text = file.read(length)
    if len(text) != length:
        raise ValueError("the state ends inside its header")
    header = json.loads(text)
    if not isinstance(header, dict):
        raise ValueError("the state's header is damaged")
    return header, _LENGTH.size + length


def _read_array(file: BinaryIO, dtype: Any, shape: list[int]) -> Any:
    size = math.prod(shape) * dtype.size
    if size == 0:
        return mx.zeros(shape, dtype=dtype)
    buffer = np.empty(size, dtype=np.uint8)
    view = memoryview(buffer)
    offset = 0
    while offset < size:
        read = file.readinto(view[offset : offset + READ_SLICE_BYTES])
        if not read:
            raise ValueError(f"the state ends after {offset} of an array's {size} bytes")
        offset += read
    return mx.array(buffer).view(dtype).reshape(shape)
