"""Bring your own MLX directories: ``--target``/``--draft`` and ``models add`` with a
model's directory (config.json and safetensors), and an EAGLE-3 or DFlash head's.

Directories with a config.json in each publisher's format and stand-in safetensors
(never loaded) test the classification, the refusals and the catalog round trip on any
machine; tiny random-weight MLX targets and heads (tests/support/tiny_mlx_heads.py) run
``draftpen generate`` end to end where mlx-vlm is installed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import main as main_module
from app.cli import models as cli_models
from app.errors import CatalogError, DraftpenError, LocalModelMissingError, PairInputError
from app.models.catalog_file import forget_command_line_pairs, load_catalog, parse_catalog
from app.models.mlx_directory import NotMlxDirectoryError, read_mlx_directory
from app.models.pair_files import pair_files
from app.models.store import ModelStore
from app.models.user_pairs import add_user_pair, forget_user_pair
from app.settings import user_catalog_path
from backends.errors import IncompatiblePairError
from tests.models.gguf_files import write_gguf
from tests.support.draftpen_cli import REPO, assert_clean_error, run_draftpen

VOCAB = 1000


@pytest.fixture(autouse=True)
def no_command_line_pairs() -> Iterator[None]:
    """A pair given with --target lives for one process; tests run in one process."""
    forget_command_line_pairs()
    yield
    forget_command_line_pairs()


def model_dir(path: Path, config: dict[str, object], *weights: int) -> Path:
    """A directory with ``config`` and one stand-in safetensors of each size in ``weights``."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for number, size in enumerate(weights or (100,)):
        (path / f"model-{number}.safetensors").write_bytes(b"\0" * size)
    return path


def qwen3(vocab: int = VOCAB) -> dict[str, object]:
    return {"model_type": "qwen3", "hidden_size": 64, "vocab_size": vocab}


def eagle3(vocab: int = VOCAB) -> dict[str, object]:
    """speculators' EAGLE-3 config: its model_type is the inner layer's, not eagle3."""
    return {
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"model_type": "llama", "vocab_size": vocab},
        "draft_vocab_size": 32,
        "target_hidden_size": 64,
    }


def dflash() -> dict[str, object]:
    """z-lab's DFlash config: a qwen3 model with a dflash_config."""
    return {**qwen3(), "dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 1]}}


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    files = tmp_path / "files"
    return {
        "target": model_dir(files / "Qwen3-8B-4bit", qwen3(), 3000, 2000),
        # 100 tokens fewer: within the padding tolerance of a shared tokenizer.
        "draft": model_dir(files / "Qwen3-0.6B-4bit", qwen3(VOCAB - 100), 500),
        "stranger": model_dir(files / "Other-1B", {"model_type": "llama", "vocab_size": 3 * VOCAB}),
        "eagle3": model_dir(files / "Qwen3-8B-eagle3", eagle3()),
        "dflash": model_dir(files / "Qwen3-8B-DFlash", dflash()),
        "dspark": model_dir(files / "Qwen3-8B-DSpark", {**dflash(), "dspark_config": {}}),
        "gguf": write_gguf(files / "small-Q8.gguf", padding=1000),
    }


def test_a_directory_is_read_as_an_mlx_model_or_the_head_its_config_names(
    dirs: dict[str, Path],
) -> None:
    target = read_mlx_directory(dirs["target"])
    assert (target.head, target.architecture, target.vocab_size) == (None, "qwen3", VOCAB)
    assert target.size_bytes == 5000  # the safetensors alone
    kinds = {name: read_mlx_directory(dirs[name]).head for name in ("eagle3", "dflash", "dspark")}
    assert kinds == {"eagle3": "eagle3", "dflash": "dflash", "dspark": "dspark"}
    assert read_mlx_directory(dirs["eagle3"]).vocab_size == VOCAB  # its target's


def test_a_directory_without_config_or_weights_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    fix = r"MLX directory \(config.json and \*.safetensors\) or a .gguf file"
    with pytest.raises(NotMlxDirectoryError, match=f"without config.json.*{fix}"):
        add_user_pair("mine", str(tmp_path / "empty"), None)
    unweighted = tmp_path / "unweighted"
    unweighted.mkdir()
    (unweighted / "config.json").write_text(json.dumps(qwen3()))
    with pytest.raises(NotMlxDirectoryError, match=f"no \\*.safetensors.*{fix}"):
        add_user_pair("mine", str(unweighted), None)
    assert not user_catalog_path().exists()


@pytest.mark.parametrize(
    ("draft", "drafter", "path_field"),
    [
        ("eagle3", "eagle3", "eagle3_head_path"),
        ("dflash", "dflash", "dflash_head_path"),
        ("draft", "model", "draft_path"),
    ],
)
def test_models_add_keeps_an_mlx_pair_that_reads_back_and_resolves_where_it_lies(
    dirs: dict[str, Path], draft: str, drafter: str, path_field: str
) -> None:
    pair = add_user_pair("mine", str(dirs["target"]), str(dirs[draft]))
    document = tomllib.loads(user_catalog_path().read_text(encoding="utf-8"))
    table = document["pairs"]["mine"]
    assert "llamacpp" not in table
    assert table["mlx"] == {
        "target": "mine.target",
        "draft": "mine.draft",
        **({"drafter": drafter} if drafter != "model" else {}),
    }
    assert document["models"]["mine.target"]["sources"] == {"local": {"path": str(dirs["target"])}}

    catalog = load_catalog()
    assert catalog.pair("mine") == pair
    variant = pair.variant("mlx")
    assert variant.drafter == drafter
    target = catalog.models_of(variant)[0]
    assert (target.format, target.architecture, target.size_bytes) == ("mlx", "qwen3", 5000)
    resolved = pair_files("mine", "mlx")
    assert resolved.target_path == dirs["target"]
    assert getattr(resolved, path_field) == dirs[draft]
    assert ModelStore(Path("unused-store")).remove(target) == 0
    assert dirs["target"].is_dir()  # never deleted

    for weights in dirs[draft].glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(LocalModelMissingError, match="models add mine"):
        pair_files("mine", "mlx")
    assert forget_user_pair("mine")
    assert not user_catalog_path().exists()


def test_only_your_own_catalog_may_name_a_local_mlx_directory(tmp_path: Path) -> None:
    text = f"""
[models.own]
name = "own"
format = "mlx"
architecture = "qwen3"
size_bytes = 10

[models.own.sources.local]
path = "{tmp_path}"

[pairs.own]
description = "d"

[pairs.own.mlx]
target = "own"
"""
    with pytest.raises(CatalogError, match="local"):
        parse_catalog(text, "models.toml")
    catalog = parse_catalog(text, "my-models.toml", allow_local=True)
    assert catalog.model("own").sources.local is not None
    assert catalog.model("own").is_local


def test_a_target_alone_is_an_mlx_pair_with_n_gram_drafts(dirs: dict[str, Path]) -> None:
    pair = add_user_pair("alone", str(dirs["stranger"]), None)
    assert pair.variants[0].runtime == "mlx" and pair.variants[0].draft is None
    assert pair_files("alone", "mlx").target_path == dirs["stranger"]


def test_what_mlx_cannot_run_as_given_is_refused_with_the_reason(dirs: dict[str, Path]) -> None:
    with pytest.raises(PairInputError, match=r"DSpark head.*llama.cpp runs DSpark.*GGUF"):
        add_user_pair("mine", str(dirs["target"]), str(dirs["dspark"]))
    with pytest.raises(PairInputError, match=r"EAGLE-3 head, not a model.*as --draft"):
        add_user_pair("mine", str(dirs["eagle3"]), None)
    with pytest.raises(IncompatiblePairError, match=r"differ \(3000 vs 1000 tokens\).*family"):
        add_user_pair("mine", str(dirs["target"]), str(dirs["stranger"]))
    other = model_dir(dirs["target"].parent / "other-eagle3", eagle3(vocab=VOCAB + 1))
    with pytest.raises(IncompatiblePairError, match=r"trained for another target.*1001"):
        add_user_pair("mine", str(dirs["target"]), str(other))
    assert not user_catalog_path().exists()


def test_a_gguf_and_an_mlx_directory_never_make_one_pair(dirs: dict[str, Path]) -> None:
    with pytest.raises(PairInputError, match=r"MLX directory but the draft .* is a GGUF.*one"):
        add_user_pair("mine", str(dirs["target"]), str(dirs["gguf"]))
    with pytest.raises(PairInputError, match=r"is a GGUF but the draft .* MLX directory"):
        add_user_pair("mine", str(dirs["gguf"]), str(dirs["eagle3"]))
    # A hub GGUF is refused beside a directory without asking the hub (it is closed here).
    with pytest.raises(PairInputError, match="one runtime"):
        add_user_pair("mine", str(dirs["target"]), "org/repo-GGUF:small-Q8.gguf")


def test_target_and_draft_directories_make_this_runs_pair_run_on_mlx(
    dirs: dict[str, Path],
) -> None:
    parser = main_module.build_parser()
    args = parser.parse_args(
        ["generate", "--target", str(dirs["target"]), "--draft", str(dirs["eagle3"])]
    )
    cli_models.apply_pair_options(args)
    assert args.pair == "Qwen3-8B-4bit" and args.runtime == "mlx"
    resolved = pair_files(args.pair, "mlx")
    assert resolved.eagle3_head_path == dirs["eagle3"]

    forget_command_line_pairs()
    chosen = argparse.Namespace(target=str(dirs["target"]), draft=None, pair=None)
    chosen.runtime = "llamacpp"
    with pytest.raises(DraftpenError, match=r"cannot run MLX directories.*--runtime mlx"):
        cli_models.apply_pair_options(chosen)
    forget_command_line_pairs()
    chosen = argparse.Namespace(target=str(dirs["gguf"]), draft=None, pair=None, runtime="mlx")
    with pytest.raises(DraftpenError, match=r"cannot run .gguf files: llama.cpp runs them"):
        cli_models.apply_pair_options(chosen)


def test_models_add_with_directories_through_the_cli(dirs: dict[str, Path]) -> None:
    added = run_draftpen(
        "models", "add", "mine", "--target", str(dirs["target"]), "--draft", str(dirs["dflash"])
    )
    assert added.returncode == 0, added.stderr
    assert "drafting with a DFlash head, on mlx" in added.stdout
    refused = run_draftpen("generate", "--target", str(dirs["eagle3"]), "-p", "hi")
    assert_clean_error(refused, "EAGLE-3 head, not a model that runs alone")


def test_reading_a_directory_imports_no_runtime(dirs: dict[str, Path]) -> None:
    """--target/--draft classify a directory on any machine: mlx is never imported."""
    script = (
        "import sys\n"
        "from app.models.user_pairs import build_pair\n"
        f"build_pair('p', 'd', {str(dirs['target'])!r}, {str(dirs['eagle3'])!r})\n"
        "print([name for name in ('mlx', 'mlx_lm', 'mlx_vlm') if name in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.real_model
@pytest.mark.parametrize(("drafter", "arch"), [("eagle3", "llama"), ("dflash", "qwen3")])
def test_generate_with_your_own_mlx_head_directory_under_exact_writes_plain_decodings_text(
    drafter: str, arch: str, tmp_path: Path
) -> None:
    """``draftpen generate --target DIR --draft HEAD_DIR --drafter eagle3|dflash --exact``."""
    pytest.importorskip("mlx_vlm", reason="mlx-vlm runs the heads on MLX")
    from tests.support import tiny_mlx_heads

    target = tiny_mlx_heads.write_mlx_target(tmp_path / f"tiny-{arch}", seed=1, arch=arch)
    write_head = getattr(tiny_mlx_heads, f"write_{drafter}_head")
    head = write_head(tmp_path / f"tiny-{arch}-{drafter}", seed=2)
    replies = {}
    for chosen in (drafter, "none"):
        result = run_draftpen(
            "generate", "--target", str(target), "--draft", str(head), "--drafter", chosen,
            "--exact", "--max-tokens", "20", "--json", "-p", "The sea is",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        replies[chosen] = json.loads(result.stdout)
    assert replies[drafter]["text"] == replies["none"]["text"]
    assert replies[drafter]["stats"]["drafted"] > 0  # the head drafted
    assert replies["none"]["stats"]["drafted"] == 0
