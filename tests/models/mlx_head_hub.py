"""An MLX target and a draft head on the local hub (tests/support/hub_server.py), and the
catalog whose ``head`` pair names them: ``[pairs.head.mlx]`` with ``drafter`` EAGLE-3 or
DFlash and the head's Hugging Face directory in ``draft``.

The head's repository is laid out as its publisher's is (config.json, safetensors, a
README and the Python file its remote code needs), so a pull shows what is fetched.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from app.models.catalog import Catalog
from app.models.catalog_file import parse_catalog
from app.models.store import ModelStore
from tests.support.hub_server import FakeHub

TARGET_REPO = "org/tiny-mlx"
HEAD_REPO = "org/tiny-head"

# Each head's config.json as its publisher writes it, reduced to what names its kind.
HEAD_CONFIGS = {
    "eagle3": {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"]},
    "dflash": {"model_type": "qwen3", "dflash_config": {"target_layer_ids": [1, 2]}},
}


def catalog_text(drafter: str) -> str:
    """A catalog with one pair, ``head``, whose mlx variant drafts with ``drafter``."""
    return f"""
[models.tiny-mlx]
name = "Tiny MLX"
format = "mlx"
architecture = "qwen3"
size_bytes = 2_100_000

[models.tiny-mlx.sources.huggingface]
repo = "{TARGET_REPO}"

[models.tiny-head]
name = "Tiny's {drafter} head, for MLX"
format = "mlx"
architecture = "{drafter}"
size_bytes = 600_000

[models.tiny-head.sources.huggingface]
repo = "{HEAD_REPO}"

[pairs.head]
description = "A tiny MLX target and its head."

[pairs.head.mlx]
target = "tiny-mlx"
draft = "tiny-head"
drafter = "{drafter}"
"""


@dataclass
class MlxHeadHub:
    """The served repositories, the catalog that names them and an empty store."""

    hub: FakeHub
    catalog: Catalog
    store: ModelStore
    head_files: dict[str, bytes]


@contextmanager
def mlx_head_hub(
    drafter: str, monkeypatch: pytest.MonkeyPatch, store: ModelStore
) -> Iterator[MlxHeadHub]:
    """Serve a tiny MLX target and a ``drafter`` head; HF_ENDPOINT points at them."""
    generator = random.Random(7)
    target_files = {
        "config.json": b'{"model_type": "qwen3"}',
        "model.safetensors": generator.randbytes(200_000),
        "tokenizer.json": b'{"version": "1.0"}',
    }
    head_files = {
        "config.json": json.dumps(HEAD_CONFIGS[drafter]).encode(),
        "model.safetensors": generator.randbytes(100_000),
        "README.md": b"a model card",
        f"{drafter}.py": b"# the publisher's remote code, which draftpen never runs",
    }
    with FakeHub() as server:
        server.add_repo(TARGET_REPO, target_files)
        server.add_repo(HEAD_REPO, dict(head_files))
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        catalog = parse_catalog(catalog_text(drafter), "heads.toml")
        yield MlxHeadHub(server, catalog, store, head_files)
