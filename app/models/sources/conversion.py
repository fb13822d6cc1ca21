"""mlx models made locally by converting a gguf model of the catalog."""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from app.errors import (
    DiskSpaceError,
    DownloadError,
)
from app.models.catalog import (
    Catalog,
    ModelEntry,
)
from app.models.source import ModelSource, fetch_model, verified_or_none
from app.models.store import ModelStore, ProgressCallback

GGUFConverter = Callable[[Path, Path], None]
"""Converts a gguf file into an MLX model directory: ``converter(gguf_path, out_dir)``.

``out_dir`` exists and is empty; the converter writes config.json, the safetensors and
the tokenizer files into it and raises on failure. It must not write the completion
marker: :class:`GGUFConversionSource` does that after the converter returns.
"""

GGUF_CONVERTER_MODULE = "app.models.sources.gguf_to_mlx"
GGUF_CONVERTER_FUNCTION = "convert_gguf_to_mlx"


def installed_gguf_converter() -> GGUFConverter | None:
    """``gguf_to_mlx.convert_gguf_to_mlx`` if this draftpen has it, else ``None``."""
    try:
        module = importlib.import_module(GGUF_CONVERTER_MODULE)
    except ModuleNotFoundError as error:
        if error.name != GGUF_CONVERTER_MODULE:
            raise  # the converter exists but one of its own imports is missing
        return None
    converter: GGUFConverter | None = getattr(module, GGUF_CONVERTER_FUNCTION, None)
    return converter


class GGUFConversionSource:
    """mlx models made locally from a gguf model of the catalog.

    The gguf model is taken from the store, or fetched first with ``gguf_sources``; the
    converter writes into :meth:`ModelStore.converted_dir_for`, and the directory is
    marked complete only after it returns. ``converter`` defaults to
    :func:`installed_gguf_converter`'s answer, looked up when a conversion starts.
    """

    name = "gguf_conversion"

    def __init__(
        self,
        catalog: Catalog,
        gguf_sources: Sequence[ModelSource],
        converter: GGUFConverter | None = None,
    ) -> None:
        self.catalog = catalog
        self.gguf_sources = tuple(gguf_sources)
        self.converter = converter

    def available_for(self, entry: ModelEntry) -> bool:
        """Whether the catalog says ``entry`` can be converted from a gguf model."""
        return entry.sources.gguf_conversion is not None

    def required_bytes(self, entry: ModelEntry, store: ModelStore) -> tuple[Path, int, int]:
        """The converted directory, plus the gguf model when it must be fetched first."""
        conversion = entry.sources.gguf_conversion
        assert conversion is not None
        gguf = self.catalog.model(conversion.from_model)
        missing_gguf = store.state(gguf) != "downloaded"
        converted = conversion.size_bytes or entry.size_bytes
        return store.root, converted + (gguf.size_bytes if missing_gguf else 0), 0

    def fetch(self, entry: ModelEntry, store: ModelStore, progress: ProgressCallback) -> Path:
        """Get the gguf model (store or its sources), convert it, mark the result complete."""
        conversion = entry.sources.gguf_conversion
        if conversion is None:
            raise DownloadError(f"Model {entry.key} has no gguf_conversion source in the catalog.")
        converter = self.converter or installed_gguf_converter()
        if converter is None:
            raise DownloadError(
                f"Cannot make {entry.key} from {conversion.from_model}: GGUF to MLX "
                f"conversion is not available in this draftpen ({GGUF_CONVERTER_MODULE} "
                "is missing). Download it from the Hugging Face hub instead, or update draftpen."
            )
        gguf = self.catalog.model(conversion.from_model)
        gguf_path = verified_or_none(store, gguf, progress)
        if gguf_path is None:
            gguf_path = fetch_model(gguf, store, self.gguf_sources, progress)
        directory = store.converted_dir_for(entry)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        progress(entry.key, "convert", 0, entry.size_bytes)
        try:
            converter(gguf_path, directory)
            store.mark_converted(entry, from_model=gguf.key)
        except BaseException as error:
            # Ctrl+C included: a half-converted directory must never look complete.
            shutil.rmtree(directory, ignore_errors=True)
            if isinstance(error, (DownloadError, KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(error, OSError) and error.errno == 28:
                raise DiskSpaceError(
                    f"The disk filled up while converting {entry.key} into {directory}. "
                    "Free up space, or set DRAFTPEN_MODELS_DIR to a bigger disk."
                ) from error
            raise DownloadError(
                f"Converting {gguf.key} into MLX format failed ({error}). "
                "Download the mlx model from the Hugging Face hub instead."
            ) from error
        progress(entry.key, "convert", entry.size_bytes, entry.size_bytes)
        return directory
