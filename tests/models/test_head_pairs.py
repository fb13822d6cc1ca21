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


MLX_HEAD = (
    '\n[models.head-mlx]\nname = "Tiny\'s head, for MLX"\nformat = "mlx"\n'
    'architecture = "dflash"\nsize_bytes = 4\n\n[models.head-mlx.sources.huggingface]\n'
    'repo = "org/tiny-head"\n'
)


def with_mlx_variant(lines: str) -> str:
    """``with_head``'s catalog plus an MLX target, an MLX head and ``lines`` as its mlx variant."""
    return (
        with_head('draft = "head"\ndrafter = "dflash"')
        + MLX_TARGET
        + MLX_HEAD
        + f'\n[pairs.solo.mlx]\ntarget = "tiny-mlx"\n{lines}\n'
    )


@pytest.mark.parametrize("drafter", ["eagle3", "dflash"])
def test_an_mlx_variant_drafts_with_an_eagle3_or_dflash_heads_directory(drafter: str) -> None:
    catalog = parse_catalog(
        with_mlx_variant(f'draft = "head-mlx"\ndrafter = "{drafter}"'), "h.toml"
    )
    variant = catalog.pair("solo").variant("mlx")
    assert (variant.drafter, variant.model_keys) == (drafter, ("tiny-mlx", "head-mlx"))
    assert variant.draft_model is None  # a head, never loaded as a model of its own
    assert "through mlx-vlm" in variant.drafting


@pytest.mark.parametrize(
    ("lines", "fragment"),
    [
        # MLX runs no DSpark or MTP head: each refused with what MLX does run.
        *(
            (
                f'draft = "head-mlx"\ndrafter = "{drafter}"',
                f'drafter = "{drafter}" runs only on llama.cpp: mlx drafts with EAGLE-3 and '
                f"DFlash heads (through mlx-vlm), not {words}",
            )
            for drafter, words in (("dspark", "a DSpark head"), ("mtp", "an MTP head"))
        ),
        # On MLX the head is a Hugging Face directory (an mlx model), not a GGUF.
        ('draft = "head"\ndrafter = "eagle3"', "draft 'head' is a gguf model; mlx needs a mlx"),
        (
            'drafter = "dflash"',
            'drafter = "dflash" needs the head\'s Hugging Face directory (an mlx model) in draft',
        ),
    ],
)
def test_an_mlx_head_variant_that_mlx_cannot_run_is_refused_with_why(
    lines: str, fragment: str
) -> None:
    with pytest.raises(CatalogError, match=r"h\.toml: \[pairs\.solo\.mlx\]") as caught:
        parse_catalog(with_mlx_variant(lines), "h.toml")
    assert fragment in str(caught.value)


# The packaged catalog's pairs with published heads: pair -> (runtime -> (drafter, the
# head's architecture); the target's architecture). A variant left out drafts with
# n-grams, or the pair has none for that runtime.
PUBLISHED_HEAD_PAIRS = {
    "qwen3-8b-dflash": ({"llamacpp": ("dflash", "dflash"), "mlx": ("dflash", "dflash")}, "qwen3"),
    "qwen3-8b-dspark": ({"llamacpp": ("dspark", "dflash")}, "qwen3"),
    "gpt-oss-20b-eagle3": ({"llamacpp": ("eagle3", "eagle3")}, "gpt-oss"),
    "qwen3-8b-eagle3": ({"mlx": ("eagle3", "eagle3")}, "qwen3"),
    "llama-8b-eagle3": ({"mlx": ("eagle3", "eagle3")}, "llama"),
}
# Pairs with no llama.cpp variant: no GGUF of their head is known.
MLX_ONLY = {"qwen3-8b-eagle3", "llama-8b-eagle3"}


def test_the_catalog_holds_real_head_pairs_for_llama_cpp_and_mlx() -> None:
    catalog = load_catalog()
    drafters: dict[str, set[str]] = {"llamacpp": set(), "mlx": set()}
    for name, (heads, target_architecture) in PUBLISHED_HEAD_PAIRS.items():
        pair = catalog.pair(name)
        assert pair.runtimes == (("mlx",) if name in MLX_ONLY else ("llamacpp", "mlx")), name
        for variant in pair.variants:
            target = catalog.model(variant.target)
            assert target.architecture == target_architecture, name
            if variant.runtime not in heads:
                # DSpark and gpt-oss on MLX: the target alone, with n-grams.
                assert variant.drafter is None and variant.draft is None, name
                continue
            drafter, head_architecture = heads[variant.runtime]
            assert variant.drafter == drafter, name
            head = catalog.model(str(variant.draft))
            assert head.format == target.format, name  # gguf for llama.cpp, a directory on MLX
            assert head.architecture == head_architecture, name
            assert head.size_bytes * 2 < target.size_bytes, name  # a head is small
            assert head.vocab_size == target.vocab_size, name  # it reads the target's vocabulary
            # A head keeps a KV cache of its own, counted in the pair's fit.
            assert head.kv_bytes_per_token and head.kv_bytes_per_token < target.kv_bytes_per_token
            # Nothing of these was hashed from here: the hub's own checksums decide.
            for model in (target, head):
                assert model.sha256 is None and model.sources.names() == ("huggingface",), name
            drafters[variant.runtime].add(drafter)
    assert {"eagle3", "dflash"} <= drafters["llamacpp"] <= set(HEAD_DRAFTERS)
    assert drafters["mlx"] == {"eagle3", "dflash"}  # MLX runs no DSpark head


def test_the_catalog_says_what_of_the_head_pairs_was_not_checked_from_here() -> None:
    text = (REPO_ROOT / "app" / "models" / "models.toml").read_text()
    section = text[text.index("Pairs with published draft heads (issue 54)") :]
    section = section[: section.index("[pairs.starter]")]
    assert "HONESTY NOTE" in section and "NOT SEEN" in section
    assert section.count("HONESTY NOTE") == 2  # the llama.cpp heads, and the MLX heads
    catalog = load_catalog()
    for name in PUBLISHED_HEAD_PAIRS:
        pair = catalog.pair(name)
        # The llama.cpp variants' models and every head are written in this section; the
        # MLX targets come from the 2026 pairs, whose own note covers them.
        keys = list(pair.variant("llamacpp").model_keys) if name not in MLX_ONLY else []
        keys += [variant.draft for variant in pair.variants if variant.draft is not None]
        for key in keys:
            start = text.index(f'[models."{key}"]')
            entry = text[start : text.index("\n[models.", start + 1)]
            assert "Approximate" in entry or "approximate" in entry, key
