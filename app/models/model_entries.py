"""Reading one ``[models.<key>]`` entry of a catalog file: its fields, config figures and sources.

A model's config figures (layers, KV heads, head dim, ``kv_layers``) must agree with its
``kv_bytes_per_token``; its sources are read by format (a gguf file from the hub, PyPI or
this machine; an mlx directory from the hub or converted from a gguf model).
:func:`check_gguf_conversions` checks, once every entry is read, that a conversion names a
gguf model.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from app.models.catalog import (
    GGUFConversion,
    HuggingFaceFile,
    HuggingFaceRepo,
    LocalFile,
    ModelEntry,
    ModelSources,
    PyPIMirror,
    WheelMember,
    shard_position,
)
from app.models.toml_tables import TableReader, table_name

SUPPORTED_FORMATS = ("gguf", "mlx")


_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")


def check_gguf_conversions(reader: TableReader, models: tuple[ModelEntry, ...]) -> None:
    """Each ``gguf_conversion`` must convert from a gguf model of the same catalog."""
    formats = {model.key: model.format for model in models}
    for model in models:
        conversion = model.sources.gguf_conversion
        if conversion is not None and formats.get(conversion.from_model) != "gguf":
            reader.fail(
                table_name("models", model.key, "sources", "gguf_conversion"),
                f"from {conversion.from_model!r} is not a gguf model in [models]",
            )


def read_model_entry(reader: TableReader, key: str, table: dict[str, Any]) -> ModelEntry:
    """One ``[models.<key>]`` table as a :class:`ModelEntry`, checked against every rule above."""
    where = table_name("models", key)
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


def _check_kv_formula(reader: TableReader, where: str, fields: dict[str, Any]) -> None:
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
    reader: TableReader, path: tuple[str, ...], table: dict[str, Any]
) -> ModelSources:
    where = table_name(*path)
    kinds: dict[str, type] = {"huggingface": dict, "pypi": dict}
    if reader.allow_local:
        kinds["local"] = dict
    reader.take(table, where, required={}, optional=kinds)
    if not table:
        reader.fail(where, "a gguf model needs at least one source (huggingface or pypi)")
    huggingface = None
    if "huggingface" in table:
        where_hub = table_name(*path, "huggingface")
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
        pypi = _pypi_mirror(reader, table_name(*path, "pypi"), table["pypi"])
    return ModelSources(huggingface=huggingface, pypi=pypi, local=_local(reader, path, table))


def _local(reader: TableReader, path: tuple[str, ...], table: dict[str, Any]) -> LocalFile | None:
    """A ``local`` source (a file or directory on this machine), if the table has one."""
    if "local" not in table:
        return None
    fields = reader.take(table["local"], table_name(*path, "local"), required={"path": str})
    return LocalFile(Path(fields["path"]).expanduser())


def _mlx_sources(reader: TableReader, path: tuple[str, ...], table: dict[str, Any]) -> ModelSources:
    where = table_name(*path)
    kinds: dict[str, type] = {"huggingface": dict, "gguf_conversion": dict}
    if reader.allow_local:
        kinds["local"] = dict  # the user's own MLX directory, used where it lies
    reader.take(table, where, required={}, optional=kinds)
    if not table:
        reader.fail(
            where, "an mlx model needs at least one source (huggingface or gguf_conversion)"
        )
    huggingface = None
    if "huggingface" in table:
        fields = reader.take(
            table["huggingface"],
            table_name(*path, "huggingface"),
            required={"repo": str},
            optional={"revision": str},
        )
        huggingface = HuggingFaceRepo(fields["repo"], fields.get("revision"))
    conversion = None
    if "gguf_conversion" in table:
        where_conversion = table_name(*path, "gguf_conversion")
        fields = reader.take(
            table["gguf_conversion"],
            where_conversion,
            required={"from": str},
            optional={"size_bytes": int},
        )
        if fields.get("size_bytes", 1) <= 0:
            reader.fail(where_conversion, "size_bytes must be positive")
        conversion = GGUFConversion(from_model=fields["from"], size_bytes=fields.get("size_bytes"))
    return ModelSources(
        huggingface=huggingface, gguf_conversion=conversion, local=_local(reader, path, table)
    )


def _pypi_mirror(reader: TableReader, where: str, table: dict[str, Any]) -> PyPIMirror:
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
