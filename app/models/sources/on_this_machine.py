"""GGUF files already on this machine, and which of them can pair.

Three places hold them: the Hugging Face cache (``models--ORG--NAME/snapshots/*/``),
LM Studio's models folder (``~/.lmstudio/models``, formerly ``~/.cache/lm-studio/models``)
and Ollama's store (``~/.ollama/models``, or ``$OLLAMA_MODELS``), where a manifest under
``manifests/HOST/NAMESPACE/NAME/TAG`` names the model's blob by digest (the layer whose
media type is ``application/vnd.ollama.image.model``) and the blob is
``blobs/sha256-<hex>``, itself a GGUF file. Every file is read in place, header only;
nothing is copied. A split GGUF counts once, by its first shard.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.errors import DraftpenError
from app.models.catalog import shard_names, shard_position
from app.models.gguf_header import GGUFHeader, read_gguf_header
from app.models.hub import HubSettings
from backends.pair_check import PairCheck, check_pair

OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
OLLAMA_DEFAULT_HOST = "registry.ollama.ai"


@dataclass(frozen=True)
class ScanPlaces:
    """Where to look; :meth:`default` is this user's real places."""

    huggingface_cache: Path | None
    lm_studio: tuple[Path, ...]
    ollama: Path | None

    @classmethod
    def default(cls) -> ScanPlaces:
        """The HF cache (HF_HOME and friends), LM Studio's folders, Ollama's store."""
        home = Path.home()
        ollama = os.environ.get("OLLAMA_MODELS")
        return cls(
            huggingface_cache=HubSettings.from_env().cache_dir,
            lm_studio=(home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"),
            ollama=Path(ollama).expanduser() if ollama else home / ".ollama" / "models",
        )


@dataclass(frozen=True)
class FoundModel:
    """A GGUF language model found on this machine."""

    path: Path
    """The file to load (the first shard of a split file; an Ollama blob)."""
    place: str
    """``Hugging Face cache``, ``LM Studio`` or ``Ollama``."""
    label: str
    """How that place names it: ``REPO/FILE``, the path under LM Studio's folder, ``NAME:TAG``."""
    size_bytes: int
    header: GGUFHeader


@dataclass(frozen=True)
class Pairing:
    """Whether ``draft`` can draft for ``target``, with llama.cpp's reason when not."""

    target: FoundModel
    draft: FoundModel
    check: PairCheck


@dataclass(frozen=True)
class ScanResult:
    """What a scan found: usable models, their pairings, and files it had to skip."""

    models: tuple[FoundModel, ...]
    pairings: tuple[Pairing, ...]
    skipped: tuple[tuple[Path, str], ...]
    """Files that look like models but are not usable, with the reason."""

    @property
    def compatible(self) -> tuple[Pairing, ...]:
        """The pairings that pass the vocabulary rule."""
        return tuple(pairing for pairing in self.pairings if pairing.check.compatible)

    def verdict_lines(self) -> list[str]:
        """A line per target + draft, models numbered from 1 in ``models`` order.

        ``[1] + [2] can pair: draftpen models add NAME --target ... --draft ...``, or
        ``[1] + [3] cannot pair: <the pair check's reason>``; the CLI and the models
        screen print the same lines.
        """
        numbers = {model.path: number for number, model in enumerate(self.models, 1)}
        lines = []
        for pairing in self.pairings:
            names = f"[{numbers[pairing.target.path]}] + [{numbers[pairing.draft.path]}]"
            if pairing.check.compatible:
                lines.append(
                    f"{names} can pair: draftpen models add NAME "
                    f"--target {pairing.target.path} --draft {pairing.draft.path}"
                )
            else:
                lines.append(f"{names} cannot pair: {pairing.check.problem}")
        return lines


def scan(places: ScanPlaces | None = None) -> ScanResult:
    """Find the GGUF models in ``places`` and check every smaller one as a draft."""
    places = places or ScanPlaces.default()
    models: list[FoundModel] = []
    skipped: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for path, place, label in _candidates(places):
        real = path.resolve()
        if real in seen:
            continue  # one blob under two names (HF snapshots, LM Studio links)
        seen.add(real)
        try:
            header = read_gguf_header(path)
        except DraftpenError as error:
            skipped.append((path, str(error)))
            continue
        if not header.has_tokenizer:
            continue  # a vision projector or similar: nothing to chat with or pair
        shards = [path.with_name(name) for name in shard_names(path.name)]
        if not all(shard.exists() for shard in shards):
            skipped.append((path, "a split model with shards missing beside it"))
            continue
        size = sum(shard.stat().st_size for shard in shards)
        models.append(FoundModel(path, place, label, size, header))
    models.sort(key=lambda model: model.size_bytes, reverse=True)
    pairings = [
        Pairing(target, draft, check_pair(target.header, draft.header))
        for index, target in enumerate(models)
        for draft in models[index + 1 :]
        if draft.size_bytes < target.size_bytes
    ]
    return ScanResult(tuple(models), tuple(pairings), tuple(skipped))


def _candidates(places: ScanPlaces) -> Iterator[tuple[Path, str, str]]:
    if places.huggingface_cache is not None:
        yield from _huggingface_cache(places.huggingface_cache)
    for folder in places.lm_studio:
        for path in _gguf_files(folder):
            yield path, "LM Studio", path.relative_to(folder).as_posix()
    if places.ollama is not None:
        yield from _ollama(places.ollama)


def _gguf_files(folder: Path) -> Iterator[Path]:
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*.gguf")):
        position = shard_position(path.name)
        if position is not None and position[0] != 1:
            continue  # shards 2..N travel with the first
        if path.is_file():
            yield path


def _huggingface_cache(cache: Path) -> Iterator[tuple[Path, str, str]]:
    if not cache.is_dir():
        return
    for repo_dir in sorted(cache.glob("models--*")):
        repo = repo_dir.name.removeprefix("models--").replace("--", "/")
        for snapshot in sorted((repo_dir / "snapshots").glob("*")):
            for path in _gguf_files(snapshot):
                yield path, "Hugging Face cache", f"{repo}/{path.relative_to(snapshot)}"


def _ollama(store: Path) -> Iterator[tuple[Path, str, str]]:
    manifests = store / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(path for path in manifests.rglob("*") if path.is_file()):
        parts = manifest.relative_to(manifests).parts
        if len(parts) != 4:
            continue  # HOST/NAMESPACE/NAME/TAG
        host, namespace, name, tag = parts
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
            digest = next(
                layer["digest"]
                for layer in layers
                if layer.get("mediaType") == OLLAMA_MODEL_MEDIA_TYPE
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration):
            continue  # not a model manifest (or not one we can read): nothing to list
        blob = store / "blobs" / str(digest).replace(":", "-", 1)
        if not blob.is_file():
            continue
        # Ollama's own short names: NAME:TAG for its library, NAMESPACE/NAME:TAG for users'.
        label = f"{name}:{tag}" if namespace == "library" else f"{namespace}/{name}:{tag}"
        if host != OLLAMA_DEFAULT_HOST:
            label = f"{host}/{namespace}/{name}:{tag}"
        yield blob, "Ollama", label
