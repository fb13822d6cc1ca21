"""Catalog pairs whose drafter is a head published for the target (EAGLE-3, DFlash,
DSpark): how a variant names one, what is refused, and the real pairs the packaged
catalog holds, each marked with what could not be checked from here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import CatalogError
from app.models.catalog import HEAD_DRAFTERS
from app.models.catalog_file import load_catalog, parse_catalog
from tests.models.catalog_texts import MINIMAL

REPO_ROOT = Path(__file__).resolve().parents[2]

HEAD = """
[models.head]
name = "Tiny's block head"
format = "gguf"
architecture = "dflash"
size_bytes = 5

[models.head.sources.huggingface]
repo = "org/tiny-dflash-GGUF"
filename = "dflash-tiny.gguf"
"""
MLX_TARGET = (
    '\n[models.tiny-mlx]\nname = "Tiny MLX"\nformat = "mlx"\narchitecture = "llama"\n'
    'size_bytes = 8\n\n[models.tiny-mlx.sources.huggingface]\nrepo = "org/tiny-mlx"\n'
)


def with_head(variant: str) -> str:
    """MINIMAL with the head model and ``variant``'s lines in its llamacpp variant."""
    return (MINIMAL + HEAD).replace('target = "tiny"', f'target = "tiny"\n{variant}')


@pytest.mark.parametrize("drafter", ["dflash", "dspark"])
def test_a_block_head_pair_drafts_with_the_head_and_never_loads_it_as_a_model(
    drafter: str,
) -> None:
    catalog = parse_catalog(with_head(f'draft = "head"\ndrafter = "{drafter}"'), "h.toml")
    variant = catalog.pair("solo").variant("llamacpp")
    assert variant.drafter == drafter
    assert variant.model_keys == ("tiny", "head")  # downloaded with its target
    assert variant.draft_model is None and variant.mtp_head is None
    assert not variant.uses_eagle3 and not variant.uses_mtp
    assert {"dflash": "DFlash head", "dspark": "DSpark head"}[drafter] in variant.drafting


@pytest.mark.parametrize("drafter", ["dflash", "dspark"])
def test_a_block_head_pair_needs_the_heads_file(drafter: str) -> None:
    with pytest.raises(CatalogError, match=r"h\.toml") as caught:
        parse_catalog(with_head(f'drafter = "{drafter}"'), "h.toml")
    assert f'drafter = "{drafter}" needs the head\'s GGUF in draft' in str(caught.value)


@pytest.mark.parametrize(
    ("drafter", "words"), [("dflash", "a DFlash head"), ("dspark", "a DSpark head")]
)
def test_an_mlx_variant_cannot_draft_with_a_block_head(drafter: str, words: str) -> None:
    text = (
        with_head(f'draft = "head"\ndrafter = "{drafter}"')
        + MLX_TARGET
        + f'\n[pairs.solo.mlx]\ntarget = "tiny-mlx"\ndrafter = "{drafter}"\n'
    )
    with pytest.raises(CatalogError, match=f"mlx cannot run {words} yet"):
        parse_catalog(text, "h.toml")


# The packaged catalog's pairs with published heads: pair -> (drafter, the head's
# llama.cpp architecture, the target's).
PUBLISHED_HEAD_PAIRS = {
    "qwen3-8b-dflash": ("dflash", "dflash", "qwen3"),
    "qwen3-8b-dspark": ("dspark", "dflash", "qwen3"),
    "gpt-oss-20b-eagle3": ("eagle3", "eagle3", "gpt-oss"),
}


def test_the_catalog_holds_real_pairs_with_eagle3_and_dflash_heads_on_llama_cpp_only() -> None:
    catalog = load_catalog()
    drafters = set()
    for name, (drafter, head_architecture, target_architecture) in PUBLISHED_HEAD_PAIRS.items():
        pair = catalog.pair(name)
        variant = pair.variant("llamacpp")
        assert variant.drafter == drafter, name
        target, head = catalog.models_of(variant)
        assert target.architecture == target_architecture, name
        assert head.architecture == head_architecture, name
        assert head.size_bytes * 3 < target.size_bytes, name  # a head is small
        assert head.vocab_size == target.vocab_size, name  # it reads the target's vocabulary
        # A head keeps a KV cache of its own, counted in the pair's fit.
        assert head.kv_bytes_per_token and head.kv_bytes_per_token < target.kv_bytes_per_token
        # Nothing of these was hashed from here: the hub's own checksums decide.
        for model in (target, head):
            assert model.sha256 is None and model.sources.names() == ("huggingface",), name
        mlx = pair.variant("mlx")  # MLX runs no head: the target alone, with n-grams
        assert mlx.drafter is None and mlx.draft is None, name
        assert catalog.model(mlx.target).architecture == target_architecture, name
        drafters.add(drafter)
    assert {"eagle3", "dflash"} <= drafters <= set(HEAD_DRAFTERS)


def test_the_catalog_says_what_of_the_head_pairs_was_not_checked_from_here() -> None:
    text = (REPO_ROOT / "app" / "models" / "models.toml").read_text()
    section = text[text.index("Pairs with published draft heads (issue 54)") :]
    section = section[: section.index("[pairs.starter]")]
    assert "HONESTY NOTE" in section and "NOT SEEN" in section
    catalog = load_catalog()
    for name in PUBLISHED_HEAD_PAIRS:
        for model in catalog.models_of(catalog.pair(name).variant("llamacpp")):
            start = text.index(f'[models."{model.key}"]')
            entry = text[start : text.index("\n[models.", start + 1)]
            assert "Approximate" in entry or "approximate" in entry, model.key
