"""Your own pairs: GGUF files or MLX directories you already have, or hub files the
catalog does not list.

A model reference is the path of a local ``.gguf`` file or MLX directory (used where it
lies, never copied), or a hub reference ``REPO:FILENAME`` of a GGUF (fetched into the HF
cache like a catalog model). GGUF pairs run on llama.cpp; a pair of MLX directories on
MLX (:mod:`app.models.own_mlx_pairs`); one pair never mixes the two.
:func:`add_user_pair` keeps a named pair in the user's own catalog file
(``my-models.toml`` in the config directory; the packaged catalog is never edited), and
:func:`use_command_line_pair` makes ``--target``/``--draft`` a pair for this run; both
then resolve through :mod:`app.models.pair_files` like any catalog pair.

Local files are checked before they are accepted: a GGUF header or an MLX directory's
config.json (else a message naming the fix), and for a target with a draft, llama.cpp's
vocabulary rule on the two headers (on two configs, their vocabulary sizes). A target
alone is always allowed (n-gram drafts). A GGUF draft whose architecture is ``eagle3``
is an EAGLE-3 head: the pair drafts with it (``drafter = "eagle3"``); one whose
architecture is ``dflash`` is a DFlash or DSpark head (``drafter = "dflash"``; loading
reads which of the two the file holds); one that holds an MTP head alone (every block a
nextn block, as in Gemma 4's ``gemma4-assistant``) is the target's MTP head
(``drafter = "mtp"``). An MLX draft directory's config says whether it is an EAGLE-3
or DFlash head.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomli_w

from app.errors import CatalogError, PairInputError
from app.models.catalog import (
    HuggingFaceFile,
    LocalFile,
    ModelEntry,
    ModelSources,
    PairEntry,
    PairVariant,
    shard_names,
)
from app.models.catalog_file import (
    add_command_line_pair,
    curated_catalog,
    load_catalog,
    parse_catalog,
)
from app.models.gguf_header import GGUFHeader, read_gguf_header
from app.models.hub import HubClient
from app.models.mlx_directory import MlxDirectory, read_mlx_directory
from app.models.own_mlx_pairs import mixed_formats, mlx_model_entry, mlx_variant
from app.settings import user_catalog_path
from backends.errors import IncompatiblePairError
from backends.pair_check import PairCheck, check_pair

_HUB_REFERENCE = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+):(?P<filename>[^:]+\.gguf)")
_PAIR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
RUNTIME = "llamacpp"
"""Your own GGUF files run on llama.cpp (MLX directories on ``mlx``)."""


@dataclass(frozen=True)
class OwnModel:
    """One model of your own pair: the catalog entry, and its GGUF header or MLX
    directory when it is on this machine."""

    entry: ModelEntry
    header: GGUFHeader | None
    directory: MlxDirectory | None = None


def parse_reference(text: str) -> LocalFile | HuggingFaceFile:
    """A local GGUF file or MLX directory (it must exist) or a hub reference ``REPO:FILENAME``."""
    path = Path(text).expanduser()
    if path.exists():
        return LocalFile(path.absolute())
    match = _HUB_REFERENCE.fullmatch(text)
    if match is not None:
        return HuggingFaceFile(match["repo"], match["filename"])
    raise PairInputError(
        f"No file at {text}. Give the path of a .gguf file or of an MLX model's directory "
        "(config.json and *.safetensors), or a Hugging Face hub GGUF as REPO:FILENAME "
        "(e.g. ggml-org/Qwen3-8B-GGUF:Qwen3-8B-Q4_K_M.gguf)."
    )


def reference_format(text: str) -> str:
    """``"mlx"`` for a local directory, ``"gguf"`` for a file or hub reference."""
    reference = parse_reference(text)
    return "mlx" if isinstance(reference, LocalFile) and reference.path.is_dir() else "gguf"


def own_model(text: str, key: str, hub: HubClient | None = None) -> OwnModel:
    """The catalog entry for a model reference; a local file's header is read and checked,
    a local directory's config.json (an MLX model or head).

    A hub file's size comes from the hub (every shard of a split file); when the hub
    cannot be reached that is a :class:`~app.errors.DownloadError` naming the fix.
    """
    reference = parse_reference(text)
    if isinstance(reference, LocalFile) and reference.path.is_dir():
        directory = read_mlx_directory(reference.path)
        return OwnModel(mlx_model_entry(directory, key), None, directory)
    if isinstance(reference, LocalFile):
        header = read_gguf_header(reference.path)
        if not header.has_tokenizer:
            raise PairInputError(
                f"{reference.path} has no tokenizer (architecture {header.architecture}): it "
                "is not a language model (a vision projector?). Give the model's own .gguf."
            )
        shards = [reference.path.with_name(name) for name in shard_names(reference.path.name)]
        missing = [shard.name for shard in shards if not shard.is_file()]
        if missing:
            raise PairInputError(
                f"{reference.path} is the first file of a split model, but "
                f"{', '.join(missing)} is not beside it. Put every shard in one directory "
                "under its own name."
            )
        entry = ModelEntry(
            key=key,
            name=header.name or reference.path.stem,
            format="gguf",
            architecture=header.architecture,
            size_bytes=max(sum(shard.stat().st_size for shard in shards), 1),
            sha256=None,
            sources=ModelSources(local=reference),
            kv_bytes_per_token=header.kv_bytes_per_token,
            vocab_size=len(header.tokens),
        )
        return OwnModel(entry, header)
    client = hub or HubClient()
    files = [client.file(reference.repo, name, None) for name in reference.filenames]
    entry = ModelEntry(
        key=key,
        name=f"{reference.repo}:{reference.filename}",
        format="gguf",
        # Known once the file is here; the catalog needs a word until then.
        architecture="unknown",
        size_bytes=sum(file.size for file in files),
        sha256=None,
        sources=ModelSources(huggingface=reference),
    )
    return OwnModel(entry, None)


def check_own_pair(target: OwnModel, draft: OwnModel | None) -> PairCheck | None:
    """llama.cpp's vocabulary rule on two local headers; ``None`` when it cannot run here.

    Hub files are checked after they are pulled (and again when the pair loads).
    """
    if draft is None or target.header is None or draft.header is None:
        return None
    return check_pair(target.header, draft.header)


def _refuse_if_incompatible(target: OwnModel, draft: OwnModel | None, name: str) -> None:
    verdict = check_own_pair(target, draft)
    if verdict is not None and not verdict.compatible:
        assert draft is not None
        raise IncompatiblePairError(
            f"{draft.entry.name} cannot draft for {target.entry.name}: {verdict.problem}. "
            "Pick a draft model from the same family (same tokenizer), or leave out --draft "
            f"and {name} runs with n-gram drafts."
        )


def build_pair(
    name: str, description: str, target_text: str, draft_text: str | None
) -> tuple[tuple[ModelEntry, ...], PairEntry]:
    """The models and pair entry for ``name``; checks files and the vocabulary rule."""
    # Formats first: a GGUF and an MLX directory never pair, and a hub file need not be
    # looked up to say so.
    target_format = reference_format(target_text)
    if draft_text and reference_format(draft_text) != target_format:
        raise mixed_formats(target_text, target_format, draft_text)
    target = own_model(target_text, f"{name}.target")
    draft = own_model(draft_text, f"{name}.draft") if draft_text else None
    models = (target.entry,) if draft is None else (target.entry, draft.entry)
    if target.directory is not None:
        variant = mlx_variant(
            target.directory,
            target.entry.key,
            draft.directory if draft is not None else None,
            draft.entry.key if draft is not None else None,
        )
        return models, PairEntry(key=name, description=description, variants=(variant,))
    _refuse_if_incompatible(target, draft, "the target")
    # An EAGLE-3 or DFlash/DSpark head (llama.cpp's eagle3 or dflash GGUF), or a file
    # holding only an MTP head, is not a model that runs alone: the target feeds it, so
    # the pair drafts with it as its head (a DSpark file is a dflash one too; loading
    # tells them apart and says so).
    head = draft_head_kind(draft.header) if draft is not None else None
    if head == "mtp":
        assert draft is not None and draft.header is not None
        layers = mtp_only_layers(draft.header)
        draft = OwnModel(replace(draft.entry, mtp_layers=layers), draft.header)
        models = (target.entry, draft.entry)
    variant = PairVariant(RUNTIME, target.entry.key, draft.entry.key if draft else None, head)
    pair = PairEntry(key=name, description=description, variants=(variant,))
    return models, pair


def mtp_only_layers(header: GGUFHeader) -> int:
    """How many MTP (nextn) blocks a GGUF declares; 0 for none."""
    arch = header.architecture
    return int(header.metadata.get(f"{arch}.nextn_predict_layers", 0) or 0)


def draft_head_kind(header: GGUFHeader | None) -> str | None:
    """The head a draft GGUF is, by its header: "eagle3" or "dflash" (a DFlash or DSpark
    head), "mtp" for a file that holds an MTP head alone: every block a nextn block (as
    llama.cpp's converter writes Gemma 4's assistant); None for a model that runs alone
    (or a hub file not here yet)."""
    if header is None:
        return None
    arch = header.architecture
    if arch in ("eagle3", "dflash"):
        return arch
    blocks = int(header.metadata.get(f"{arch}.block_count", 0) or 0)
    nextn = mtp_only_layers(header)
    return "mtp" if nextn > 0 and nextn >= blocks else None


def add_user_pair(
    name: str,
    target_text: str,
    draft_text: str | None,
    *,
    replace: bool = False,
    path: Path | None = None,
) -> PairEntry:
    """Keep a pair in the user's own catalog file; it then works like a curated pair."""
    path = path if path is not None else user_catalog_path()
    if not _PAIR_NAME.fullmatch(name):
        raise PairInputError(
            f"Pair name {name!r} may hold only letters, digits, '.', '_' and '-'. Pick another."
        )
    document = _read_document(path)
    pairs: dict[str, Any] = document.setdefault("pairs", {})
    if name in pairs and not replace:
        raise PairInputError(
            f"You already have a pair called {name!r} (in {path}). Add it with --replace to "
            f"overwrite it, or remove it first: draftpen models forget {name}"
        )
    forget_from_document(document, name)
    if name in curated_catalog().pair_names():
        raise PairInputError(
            f"{name!r} is a pair of draftpen's own catalog. Pick another name for yours."
        )
    description = f"Your own pair: {target_text}" + (f" + {draft_text}" if draft_text else "")
    models, pair = build_pair(name, description, target_text, draft_text)
    document.setdefault("models", {})
    for entry in models:
        document["models"][entry.key] = _model_table(entry)
    variant = pair.variants[0]
    runtime_table = {"target": variant.target}
    if variant.draft is not None:
        runtime_table["draft"] = variant.draft
    if variant.drafter in ("eagle3", "dflash", "mtp"):
        runtime_table["drafter"] = variant.drafter
    pairs[name] = {"description": pair.description, variant.runtime: runtime_table}
    _write_document(path, document)
    return pair


def forget_user_pair(name: str, path: Path | None = None) -> bool:
    """Remove a pair (and its models) from the user's catalog; ``False`` if it had none.

    Files are left alone: a local file is yours, and hub files are removed with
    ``draftpen models rm`` first.
    """
    path = path if path is not None else user_catalog_path()
    document = _read_document(path)
    if name not in document.get("pairs", {}):
        return False
    forget_from_document(document, name)
    _write_document(path, document)
    return True


def forget_from_document(document: dict[str, Any], name: str) -> None:
    """Drop pair ``name`` and the models only it used from a parsed user catalog."""
    pair = document.get("pairs", {}).pop(name, None)
    if pair is None:
        return
    used = {
        key
        for other in document.get("pairs", {}).values()
        for runtime in other.values()
        if isinstance(runtime, dict)
        for key in runtime.values()
    }
    for runtime in pair.values():
        if isinstance(runtime, dict):
            for key in runtime.values():
                if key not in used:
                    document.get("models", {}).pop(key, None)


def use_command_line_pair(target_text: str, draft_text: str | None) -> str:
    """Make ``--target``/``--draft`` a pair for this run; returns its name.

    The name comes from the target's file name (what ``/v1/models`` and the chat show).
    """
    # A directory's name (an MLX model), or a file's without .gguf.
    stem = Path(target_text.rsplit(":", 1)[-1]).expanduser().name.removesuffix(".gguf")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._") or "own-pair"
    taken = set(load_catalog().pair_names())
    while name in taken:
        name += "-own"
    description = "Given on the command line: " + target_text
    if draft_text:
        description += f" + {draft_text}"
    models, pair = build_pair(name, description, target_text, draft_text)
    add_command_line_pair(models, pair)
    return name


def _model_table(entry: ModelEntry) -> dict[str, Any]:
    table: dict[str, Any] = {
        "name": entry.name,
        "format": entry.format,
        "architecture": entry.architecture,
        "size_bytes": entry.size_bytes,
    }
    if entry.kv_bytes_per_token:
        table["kv_bytes_per_token"] = entry.kv_bytes_per_token
    if entry.vocab_size:
        table["vocab_size"] = entry.vocab_size
    if entry.mtp_layers:
        table["mtp_layers"] = entry.mtp_layers
    if entry.sources.local is not None:
        table["sources"] = {"local": {"path": str(entry.sources.local.path)}}
    else:
        source = entry.sources.huggingface
        assert isinstance(source, HuggingFaceFile)
        table["sources"] = {"huggingface": {"repo": source.repo, "filename": source.filename}}
    return table


def _read_document(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise CatalogError(f"Cannot read your pairs file {path}: {error}") from error
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(
            f"Your pairs file {path} is not valid TOML ({error}). Fix it or delete it."
        ) from error


_HEADER = (
    "# Your own model pairs, written by `draftpen models add` (same format as draftpen's\n"
    "# models.toml; a `local` source is a file or MLX directory used where it lies).\n"
    "# Edit with care, or use `draftpen models add NAME ... --replace` and\n"
    "# `draftpen models forget NAME`.\n\n"
)


def _write_document(path: Path, document: dict[str, Any]) -> None:
    if not document.get("pairs"):
        path.unlink(missing_ok=True)  # no pairs left: no file, as before the first add
        return
    text = _HEADER + tomli_w.dumps(document)
    # Validate before writing, so a bad entry never makes every later command fail.
    parse_catalog(text, str(path), allow_local=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text, encoding="utf-8")
    staging.replace(path)
