"""Pairs whose drafter is an EAGLE-3 head: in the catalog (``drafter = "eagle3"``, the
head's GGUF in ``draft``; on MLX its Hugging Face directory) and from your own files
(``--target``/``--draft HEAD``).

The head is downloaded with its target but is never a model of its own: it is handed
to the engine, which attaches it to the target (``attach_eagle3_head``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.errors import CatalogError
from app.loading import load_engine
from app.models.catalog_file import forget_command_line_pairs, parse_catalog
from app.models.pair_download import download_pair
from app.models.pair_files import resolve_pair
from app.models.store import ModelStore
from app.models.user_pairs import use_command_line_pair
from backends.engine_slots import EngineSlots
from backends.runtime_exchange import RuntimeExchange
from tests.models.catalog_texts import MINIMAL
from tests.models.mlx_head_hub import mlx_head_hub
from tests.support.draftpen_cli import run_draftpen
from tests.support.head_pairs import check_loaded_head_drafts
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tiny_eagle3 import write_eagle3_head, write_tiny_target

HEAD = """
[models.head]
name = "Tiny's EAGLE-3 head"
format = "gguf"
architecture = "eagle3"
size_bytes = 5

[models.head.sources.huggingface]
repo = "org/tiny-eagle3-GGUF"
filename = "tiny-eagle3.gguf"
"""


@pytest.fixture(autouse=True)
def no_command_line_pairs() -> Iterator[None]:
    """A pair given with --target lives for one process; tests run in one process."""
    forget_command_line_pairs()
    yield
    forget_command_line_pairs()


def with_head(variant: str) -> str:
    """MINIMAL with the head model and ``variant``'s lines in its llamacpp variant."""
    return (MINIMAL + HEAD).replace('target = "tiny"', f'target = "tiny"\n{variant}')


def test_an_eagle3_pair_drafts_with_the_head_and_never_loads_it_as_a_model() -> None:
    catalog = parse_catalog(with_head('draft = "head"\ndrafter = "eagle3"'), "e.toml")
    variant = catalog.pair("solo").variant("llamacpp")
    assert variant.uses_eagle3 and not variant.uses_mtp
    assert variant.model_keys == ("tiny", "head")  # downloaded with its target
    assert variant.draft_model is None and variant.mtp_head is None
    assert "EAGLE-3 head" in variant.drafting


@pytest.mark.parametrize(
    ("variant", "fragment"),
    [
        ('drafter = "eagle3"', 'drafter = "eagle3" needs the head\'s GGUF in draft'),
        ('drafter = "eagle-3"', "drafter must be one of model, mtp, eagle3, dflash, dspark"),
    ],
)
def test_malformed_eagle3_pairs_are_refused_with_the_fix(variant: str, fragment: str) -> None:
    with pytest.raises(CatalogError, match=r"e\.toml") as caught:
        parse_catalog(with_head(variant), "e.toml")
    assert fragment in str(caught.value)


def test_an_mlx_eagle3_pair_pulls_the_heads_directory_and_hands_it_over_as_the_head(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On MLX the head is its publisher's Hugging Face directory: a pull fetches its
    config and safetensors (never its Python), and loading gets it as the EAGLE-3 head."""
    with mlx_head_hub("eagle3", monkeypatch, ModelStore(tmp_path / "store")) as served:
        variant = served.catalog.pair("head").variant("mlx")
        assert variant.uses_eagle3 and variant.draft_model is None
        assert "EAGLE-3 head (run through mlx-vlm)" in variant.drafting
        resolved = download_pair(served.catalog, "head", served.store, runtime="mlx")
        head = resolved.eagle3_head_path
        assert head is not None and head.is_dir()
        assert resolved.draft_path is None and resolved.dflash_head_path is None
        for name in ("config.json", "model.safetensors"):
            assert (head / name).read_bytes() == served.head_files[name]
        assert not (head / "eagle3.py").exists()  # draftpen never runs a repository's code
        assert resolve_pair(served.catalog, "head", served.store, "mlx") == resolved


@pytest.mark.real_model
def test_your_own_target_and_eagle3_head_load_as_a_pair_that_drafts_with_it(tmp_path: Path):
    """``--target TINY --draft HEAD``: the head's architecture makes it the pair's
    drafter; loading attaches it, and ``--drafter eagle3`` drafts with it."""
    tokenizer = require_model(SMOLLM2_KEY)
    target = write_tiny_target(tmp_path / "tiny-llama.gguf", tokenizer, seed=1)
    head = write_eagle3_head(tmp_path / "tiny-llama-eagle3.gguf", target, seed=2)
    name = use_command_line_pair(str(target), str(head))
    messages: list[str] = []
    engine = load_engine(
        name, n_ctx=256, runtime="llamacpp", calibrate=False, on_progress=messages.append
    )
    check_loaded_head_drafts(engine, messages, "EAGLE-3 head", "eagle3")


@pytest.mark.real_model
def test_generate_with_your_own_eagle3_head_under_exact_writes_plain_decodings_text(
    tmp_path: Path,
):
    """``draftpen generate --target T --draft HEAD --drafter eagle3 --exact``."""
    tokenizer = require_model(SMOLLM2_KEY)
    target = write_tiny_target(tmp_path / "tiny-llama.gguf", tokenizer, seed=1)
    head = write_eagle3_head(tmp_path / "tiny-llama-eagle3.gguf", target, seed=2)
    replies = {}
    for drafter in ("eagle3", "none"):
        result = run_draftpen(
            "generate", "--target", str(target), "--draft", str(head), "--drafter", drafter,
            "--exact", "--max-tokens", "20", "--json", "-p", "The sea is",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        replies[drafter] = json.loads(result.stdout)
    assert replies["eagle3"]["text"] == replies["none"]["text"]
    assert replies["eagle3"]["stats"]["drafted"] > 0


@pytest.mark.real_model
def test_a_head_pair_serves_several_sequences_each_drafting_with_the_head(tmp_path: Path):
    """``--parallel 2`` on llama.cpp: both sequences' slots draft with a head state of
    their own, and nothing says the pair fell back to n-grams."""
    tokenizer = require_model(SMOLLM2_KEY)
    target = write_tiny_target(tmp_path / "tiny-llama.gguf", tokenizer, seed=1)
    head = write_eagle3_head(tmp_path / "tiny-llama-eagle3.gguf", target, seed=2)
    name = use_command_line_pair(str(target), str(head))
    messages: list[str] = []
    engine = load_engine(
        name, n_ctx=256, runtime="llamacpp", calibrate=False, parallel=2,
        on_progress=messages.append,
    )  # fmt: skip
    slots = EngineSlots(engine, RuntimeExchange())
    try:
        assert engine.target.parallel == 2  # type: ignore[attr-defined]
        assert not any("n-grams instead" in message for message in messages), messages
        heads = [slots.take([]).drafter_named("eagle3").head for _ in range(2)]
        assert [head.seq for head in heads] == [0, 1]  # type: ignore[attr-defined]
    finally:
        slots.close()
        engine.close()
