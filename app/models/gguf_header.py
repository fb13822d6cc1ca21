"""What a GGUF file says about itself, read from its header without loading the model.

A GGUF file starts with ``GGUF``, a version, the tensor count and a list of typed
key/value pairs (architecture, layer and head counts, the tokenizer's tokens and special
ids); the tensors follow. Reading only those pairs takes milliseconds even for a 40 GB
file, so ``draftpen models scan`` can look at every file on the machine and the pair
check can run before anything is loaded. :class:`GGUFHeader` is a
:class:`~backends.pair_check.Vocabulary`, so :func:`~backends.pair_check.check_pair`
applies llama.cpp's rule to two headers directly.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from app.errors import DraftpenError
from backends.base import VocabInfo

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# Fixed-size value types by GGUF type id: struct format.
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_FIXED |= {11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# No key or string in a real header comes near this; a bigger length means damage.
_MAX_STRING_BYTES = 1 << 24
_WANTED_ARRAYS = ("tokenizer.ggml.tokens",)


class NotGGUFError(DraftpenError):
    """A file that is not a GGUF model (or is damaged) where one was expected."""


@dataclass(frozen=True)
class GGUFHeader:
    """The header facts draftpen uses: architecture, shapes, and the tokenizer."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tokens: tuple[str, ...] = field(repr=False)

    @property
    def architecture(self) -> str:
        """``general.architecture``, e.g. ``qwen2``, ``llama``, ``gemma3``."""
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str | None:
        """``general.name`` when the file has one."""
        value = self.metadata.get("general.name")
        return str(value) if value is not None else None

    @property
    def has_tokenizer(self) -> bool:
        """Whether the file carries a vocabulary (vision projectors and the like do not)."""
        return bool(self.tokens)

    @property
    def split_count(self) -> int:
        """How many files the model is split into (``split.count``; 1 when whole)."""
        return int(self.metadata.get("split.count", 1))

    def _arch(self, key: str) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}")

    @property
    def kv_bytes_per_token(self) -> int | None:
        """An f16 KV cache's bytes per token, from layer and head counts; ``None`` if unknown."""
        layers, kv_heads = self._arch("block_count"), self._arch("attention.head_count_kv")
        heads, width = self._arch("attention.head_count"), self._arch("embedding_length")
        if isinstance(kv_heads, list):  # some architectures list it per layer
            kv_heads = max(kv_heads) if kv_heads else None
        if isinstance(heads, list):
            heads = max(heads) if heads else None
        key_length = self._arch("attention.key_length")
        value_length = self._arch("attention.value_length")
        if key_length is None and heads and width:
            key_length = value_length = width // heads
        value_length = value_length if value_length is not None else key_length
        if not (layers and kv_heads and key_length and value_length):
            return None
        return int(layers) * int(kv_heads) * (int(key_length) + int(value_length)) * 2

    def vocab_info(self) -> VocabInfo:
        """The facts llama.cpp's pair rule compares, as llama.cpp reads them."""
        vocab_type = str(self.metadata.get("tokenizer.ggml.model", "none"))
        # llama.cpp adds BOS by default for SentencePiece vocabularies only.
        add_bos = self.metadata.get("tokenizer.ggml.add_bos_token", vocab_type == "llama")
        return VocabInfo(
            vocab_type=vocab_type,
            n_vocab=len(self.tokens),
            bos_id=int(self.metadata.get("tokenizer.ggml.bos_token_id", -1)),
            eos_id=int(self.metadata.get("tokenizer.ggml.eos_token_id", -1)),
            add_bos=bool(add_bos),
            add_eos=bool(self.metadata.get("tokenizer.ggml.add_eos_token", False)),
        )

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text for ``token``."""
        return self.tokens[token]


def read_gguf_header(path: Path) -> GGUFHeader:
    """Read ``path``'s GGUF header; :class:`NotGGUFError` names the fix when it is none."""
    try:
        with path.open("rb") as file:
            return _read(file, path)
    except IsADirectoryError as error:
        raise NotGGUFError(
            f"{path} is a directory, not a GGUF file. Give the path of the .gguf file itself."
        ) from error
    except FileNotFoundError as error:
        raise NotGGUFError(
            f"There is no file at {path}. Check the path (a hub file is written REPO:FILENAME)."
        ) from error
    except OSError as error:
        raise NotGGUFError(f"Cannot read {path}: {error.strerror or error}.") from error
    except (struct.error, UnicodeDecodeError, EOFError) as error:
        raise NotGGUFError(
            f"{path} has a damaged GGUF header ({error}). Download the file again."
        ) from error


def _read(file: BinaryIO, path: Path) -> GGUFHeader:
    magic = file.read(4)
    if magic != MAGIC:
        raise NotGGUFError(
            f"{path} is not a GGUF model file (it starts with {magic!r}, not b'GGUF'). "
            "draftpen runs llama.cpp's GGUF files; convert the model with llama.cpp's "
            "convert_hf_to_gguf.py, or download a GGUF build of it."
        )
    (version,) = struct.unpack("<I", _exactly(file, 4))
    if version not in SUPPORTED_VERSIONS:
        raise NotGGUFError(
            f"{path} is GGUF version {version}; draftpen reads versions 2 and 3. "
            "Download a current GGUF build of the model."
        )
    _tensor_count, kv_count = struct.unpack("<QQ", _exactly(file, 16))
    metadata: dict[str, Any] = {}
    tokens: tuple[str, ...] = ()
    for _ in range(kv_count):
        key = _string(file)
        (value_type,) = struct.unpack("<I", _exactly(file, 4))
        if value_type == _ARRAY:
            (item_type,) = struct.unpack("<I", _exactly(file, 4))
            (count,) = struct.unpack("<Q", _exactly(file, 8))
            if key in _WANTED_ARRAYS and item_type == _STRING:
                tokens = tuple(_string(file) for _ in range(count))
            else:
                metadata[key] = _array(file, item_type, count)
        else:
            metadata[key] = _value(file, value_type)
    return GGUFHeader(path=path, version=version, metadata=metadata, tokens=tokens)


# Arrays longer than this are skipped, not kept: only short ones (per-layer head counts)
# are ever read, and merges or scores would cost memory for nothing.
_KEPT_ARRAY_ITEMS = 1024


def _array(file: BinaryIO, item_type: int, count: int) -> list[Any] | None:
    if item_type in _FIXED and count > _KEPT_ARRAY_ITEMS:
        file.seek(struct.calcsize(_FIXED[item_type]) * count, 1)
        return None
    if item_type == _STRING and count > _KEPT_ARRAY_ITEMS:
        for _ in range(count):
            (length,) = struct.unpack("<Q", _exactly(file, 8))
            file.seek(_checked_length(length), 1)
        return None
    return [_value(file, item_type) for _ in range(count)]


def _value(file: BinaryIO, value_type: int) -> Any:
    if value_type in _FIXED:
        fmt = _FIXED[value_type]
        return struct.unpack(fmt, _exactly(file, struct.calcsize(fmt)))[0]
    if value_type == _STRING:
        return _string(file)
    if value_type == _ARRAY:
        (item_type,) = struct.unpack("<I", _exactly(file, 4))
        (count,) = struct.unpack("<Q", _exactly(file, 8))
        return _array(file, item_type, count)
    raise struct.error(f"unknown value type {value_type}")


def _string(file: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", _exactly(file, 8))
    return _exactly(file, _checked_length(length)).decode("utf-8", errors="replace")


def _checked_length(length: int) -> int:
    if length > _MAX_STRING_BYTES:
        raise struct.error(f"a string of {length} bytes")
    return length


def _exactly(file: BinaryIO, count: int) -> bytes:
    data = file.read(count)
    if len(data) != count:
        raise EOFError("the file ends inside its header")
    return data
