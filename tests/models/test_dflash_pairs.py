"""Pairs whose drafter is a DFlash or DSpark head: in a catalog (``drafter = "dflash"`` or
``"dspark"``, the head's GGUF in ``draft``; on MLX a DFlash head's Hugging Face directory,
and no DSpark head) and from your own files (``--target``/``--draft HEAD``).

The head is downloaded with its target but is never a model of its own: it is handed
to the engine, which attaches it to the target (``attach_dflash_head``); the file says
whether it is a DFlash or a DSpark head.
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
from app.models.store import ModelStore
from app.models.user_pairs import use_command_line_pair
from tests.models.catalog_texts import MINIMAL
from tests.models.mlx_head_hub import mlx_head_hub
from tests.support.draftpen_cli import run_draftpen
from tests.support.head_pairs import check_loaded_head_drafts
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.tiny_dflash import write_dflash_head
from tests.support.tiny_eagle3 import write_tiny_target

HEAD = """
[models.head]
name = "Tiny's DFlash head"
format = "gguf"
architecture = "dflash"
size_bytes = 5

[models.head.sources.huggingface]
repo = "org/tiny-dflash-GGUF"
filename = "tiny-dflash.gguf"
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


@pytest.mark.parametrize(("drafter", "name"), [("dflash", "DFlash"), ("dspark", "DSpark")])
def test_a_block_head_pair_drafts_with_the_head_and_never_loads_it_as_a_model(
    drafter: str, name: str
) -> None:
    catalog = parse_catalog(with_head(f'draft = "head"\ndrafter = "{drafter}"'), "e.toml")
    variant = catalog.pair("solo").variant("llamacpp")
    assert variant.drafter == drafter and not variant.uses_eagle3 and not variant.uses_mtp
    assert variant.model_keys == ("tiny", "head")  # downloaded with its target
    assert variant.draft_model is None and variant.mtp_head is None
    assert f"{name} head" in variant.drafting


@pytest.mark.parametrize(
    ("variant", "fragment"),
    [
        ('drafter = "dflash"', 'drafter = "dflash" needs the head\'s GGUF in draft'),
        ('drafter = "dspark"', 'drafter = "dspark" needs the head\'s GGUF in draft'),
        ('drafter = "d-flash"', "drafter must be one of model, mtp, eagle3, dflash, dspark"),
    ],
)
def test_malformed_block_head_pairs_are_refused_with_the_fix(variant: str, fragment: str) -> None:
    with pytest.raises(CatalogError, match=r"e\.toml") as caught:
        parse_catalog(with_head(variant), "e.toml")
    assert fragment in str(caught.value)


def test_an_mlx_dflash_pair_pulls_the_heads_directory_and_hands_it_over_as_the_head(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On MLX a DFlash head is z-lab's Hugging Face directory, fetched without its Python
    and handed to loading as the block head."""
    with mlx_head_hub("dflash", monkeypatch, ModelStore(tmp_path / "store")) as served:
        resolved = download_pair(served.catalog, "head", served.store, runtime="mlx")
        head = resolved.dflash_head_path
        assert head is not None and (head / "config.json").is_file()
        assert (head / "model.safetensors").read_bytes() == served.head_files["model.safetensors"]
        assert not (head / "dflash.py").exists()
        assert resolved.draft_path is None and resolved.eagle3_head_path is None
        assert resolved.variant.drafter == "dflash"


def test_an_mlx_variant_cannot_draft_with_a_dspark_head() -> None:
    """MLX runs EAGLE-3 and DFlash heads; a DSpark variant there is refused, saying so."""
    text = (
        with_head('draft = "head"\ndrafter = "dspark"')
        + '\n[models.tiny-mlx]\nname = "Tiny MLX"\nformat = "mlx"\narchitecture = "llama"\n'
        + 'size_bytes = 8\n\n[models.tiny-mlx.sources.huggingface]\nrepo = "org/tiny-mlx"\n'
        + '\n[pairs.solo.mlx]\ntarget = "tiny-mlx"\ndrafter = "dspark"\n'
    )
    with pytest.raises(CatalogError, match=r"e\.toml: \[pairs\.solo\.mlx\]") as caught:
        parse_catalog(text, "e.toml")
    message = str(caught.value)
    assert 'drafter = "dspark" runs only on llama.cpp' in message
    assert "EAGLE-3 and DFlash heads (through mlx-vlm), not a DSpark head" in message


@pytest.mark.real_model
@pytest.mark.parametrize("dspark", [False, True])
def test_your_own_target_and_block_head_load_as_a_pair_that_drafts_with_it(
    tmp_path: Path, dspark: bool
):
    """``--target TINY --draft HEAD``: the head's architecture (dflash) makes it the
    pair's drafter; loading attaches it and says which head the file holds."""
    tokenizer = require_model(SMOLLM2_KEY)
    target = write_tiny_target(tmp_path / "tiny-llama.gguf", tokenizer, seed=1)
    head = write_dflash_head(tmp_path / "tiny-llama-head.gguf", target, seed=2, dspark=dspark)
    name = use_command_line_pair(str(target), str(head))
    messages: list[str] = []
    engine = load_engine(
        name, n_ctx=256, runtime="llamacpp", calibrate=False, on_progress=messages.append
    )
    drafter = "dspark" if dspark else "dflash"
    check_loaded_head_drafts(engine, messages, "DFlash/DSpark head", drafter)


@pytest.mark.real_model
@pytest.mark.parametrize("dspark", [False, True])
def test_generate_with_your_own_block_head_under_exact_writes_plain_decodings_text(
    tmp_path: Path, dspark: bool
):
    """``draftpen generate --target T --draft HEAD --drafter dflash --exact`` (dspark
    for a DSpark head)."""
    tokenizer = require_model(SMOLLM2_KEY)
    target = write_tiny_target(tmp_path / "tiny-llama.gguf", tokenizer, seed=1)
    head = write_dflash_head(tmp_path / "tiny-llama-head.gguf", target, seed=2, dspark=dspark)
    drafter = "dspark" if dspark else "dflash"
    replies = {}
    for choice in (drafter, "none"):
        result = run_draftpen(
            "generate", "--target", str(target), "--draft", str(head), "--drafter", choice,
            "--exact", "--max-tokens", "20", "--json", "-p", "The sea is",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        replies[choice] = json.loads(result.stdout)
    assert replies[drafter]["text"] == replies["none"]["text"]
    assert replies[drafter]["stats"]["drafted"] > 0
