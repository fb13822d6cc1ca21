"""A pair on the local hub (tests/support/hub_server.py): its repositories, files and sizes,
the catalog that names them, and the hub fixture that serves them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest

from app.models.catalog import Catalog
from app.models.catalog_file import parse_catalog
from app.models.pair_download import download_pair
from app.models.store import ModelStore
from tests.support.hub_server import FakeHub

TARGET_REPO = "org/tiny-GGUF"
DRAFT_REPO = "org/tiny-draft-GGUF"
MLX_REPO = "org/tiny-mlx"
TARGET_FILE = "tiny-q4.gguf"
DRAFT_FILE = "tiny-draft-q8.gguf"
TARGET_SIZE = 3_000_000
DRAFT_SIZE = 1_500_000


def catalog_text(*, target_sha: str | None = None) -> str:
    sha_line = f'sha256 = "{target_sha}"\n' if target_sha else ""
    return f"""
[models.tiny-target]
name = "Tiny target"
format = "gguf"
architecture = "llama"
size_bytes = {TARGET_SIZE}
{sha_line}
[models.tiny-target.sources.huggingface]
repo = "{TARGET_REPO}"
filename = "{TARGET_FILE}"

[models.tiny-draft]
name = "Tiny draft"
format = "gguf"
architecture = "llama"
size_bytes = {DRAFT_SIZE}

[models.tiny-draft.sources.huggingface]
repo = "{DRAFT_REPO}"
filename = "{DRAFT_FILE}"

[models.tiny-mlx]
name = "Tiny MLX"
format = "mlx"
architecture = "llama"
size_bytes = 2_100_000

[models.tiny-mlx.sources.huggingface]
repo = "{MLX_REPO}"

[pairs.tiny]
description = "Two tiny hub models."

[pairs.tiny.llamacpp]
target = "tiny-target"
draft = "tiny-draft"

[pairs.tiny.mlx]
target = "tiny-mlx"
"""


@dataclass
class HubSetup:
    hub: FakeHub
    catalog: Catalog
    store: ModelStore
    target_bytes: bytes
    draft_bytes: bytes
    mlx_files: dict[str, bytes]

    @property
    def cache_root(self) -> Path:
        return self.store.hub_cache.root

    def pull(self, runtime: str = "llamacpp", **kwargs: object):
        kwargs.setdefault("check_tokenizers", False)  # random bytes, not GGUF
        return download_pair(self.catalog, "tiny", self.store, runtime=runtime, **kwargs)  # type: ignore[arg-type]

    def incomplete_files(self) -> list[Path]:
        return sorted(self.cache_root.rglob("*.incomplete"))


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubSetup]:
    generator = random.Random(5)
    target = b"GGUF" + generator.randbytes(TARGET_SIZE - 4)
    draft = b"GGUF" + generator.randbytes(DRAFT_SIZE - 4)
    mlx_files = {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": generator.randbytes(2_000_000),
        "tokenizer.json": b'{"version": "1.0"}' + b" " * 2000,
        "README.md": b"not needed by mlx-lm",
    }
    # huggingface_hub reads 10 MB per chunk; small chunks let these small files be cut
    # part-way (drops, cancels) the way a multi-GB file is in real life.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    with FakeHub() as server:
        server.add_repo(TARGET_REPO, {TARGET_FILE: target})
        server.add_repo(DRAFT_REPO, {DRAFT_FILE: draft})
        server.add_repo(MLX_REPO, dict(mlx_files))
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield HubSetup(
            hub=server,
            catalog=parse_catalog(catalog_text(), "test.toml"),
            store=ModelStore(tmp_path / "store"),
            target_bytes=target,
            draft_bytes=draft,
            mlx_files=mlx_files,
        )
