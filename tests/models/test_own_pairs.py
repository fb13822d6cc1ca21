"""Bring your own pair: local GGUF files and hub files, `models add`, `models scan`, flags.

Header-only GGUF files (tests/models/gguf_files.py) stand in for models where nothing is loaded;
the real test models check the header reader against llama.cpp's own reading, the
vocabulary rule's reason on a real mismatch, and that a pair given by paths writes what
the catalog pair writes.
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest

from app import main as main_module
from app.cli import models as cli_models
from app.cli import pair_listing
from app.errors import DraftpenError, LocalModelMissingError
from app.models.catalog_file import forget_command_line_pairs, load_catalog
from app.models.fit import MachineMemory
from app.models.gguf_header import NotGGUFError, read_gguf_header
from app.models.overview import pair_overview
from app.models.pair_download import download_pair
from app.models.pair_files import pair_files, pair_state
from app.models.sources.on_this_machine import ScanPlaces, scan
from app.models.store import ModelStore
from app.models.user_pairs import PairInputError, add_user_pair, forget_user_pair
from app.settings import user_catalog_path
from backends.errors import IncompatiblePairError
from tests.models.gguf_files import vocabulary, write_gguf
from tests.support.hub_server import FakeHub
from tests.support.model_files import DRAFT_KEY, SMOLLM2_KEY, TARGET_KEY, require_model

MACHINE = MachineMemory(ram_bytes=64_000_000_000)


@pytest.fixture(autouse=True)
def no_command_line_pairs() -> Iterator[None]:
    """A pair given with --target lives for one process; tests run in one process."""
    forget_command_line_pairs()
    yield
    forget_command_line_pairs()


@pytest.fixture
def family(tmp_path: Path) -> dict[str, Path]:
    """A target, a draft of its family, and a model of another family (other BOS/EOS)."""
    return {
        "target": write_gguf(tmp_path / "files" / "big-Q4.gguf", padding=40_000),
        # 60 tokens fewer: within llama.cpp's 128-token tolerance.
        "draft": write_gguf(
            tmp_path / "files" / "small-Q8.gguf", tokens=vocabulary(240), padding=4_000
        ),
        "stranger": write_gguf(
            tmp_path / "files" / "other-Q8.gguf",
            architecture="llama",
            tokens=vocabulary(300, "w"),
            bos=7,
            eos=8,
            padding=2_000,
        ),
    }


def test_the_header_reader_reads_the_vocabulary_and_the_kv_shape(family: dict[str, Path]) -> None:
    header = read_gguf_header(family["target"])
    assert header.architecture == "qwen2"
    assert len(header.tokens) == 300 and header.token_text(5) == "tok5"
    info = header.vocab_info()
    assert (info.vocab_type, info.n_vocab, info.bos_id, info.eos_id) == ("gpt2", 300, 1, 2)
    # 4 layers x 2 KV heads x (16 + 16) dims x 2 bytes; head dim = 64 wide / 4 heads.
    assert header.kv_bytes_per_token == 4 * 2 * 32 * 2


def test_a_missing_path_and_a_non_gguf_file_get_messages_that_name_the_fix(
    tmp_path: Path,
) -> None:
    with pytest.raises(PairInputError, match=r"No file at .*REPO:FILENAME"):
        add_user_pair("mine", str(tmp_path / "nope.gguf"), None)
    text_file = tmp_path / "notes.gguf"
    text_file.write_text("hello")
    with pytest.raises(NotGGUFError, match=r"not a GGUF model file.*convert_hf_to_gguf"):
        add_user_pair("mine", str(text_file), None)
    assert not user_catalog_path().exists()


def test_models_add_keeps_the_pair_beside_the_settings_and_it_works_like_a_catalog_pair(
    family: dict[str, Path],
) -> None:
    pair = add_user_pair("mine", str(family["target"]), str(family["draft"]))
    assert user_catalog_path().is_file()
    assert user_catalog_path().name == "my-models.toml"

    catalog = load_catalog()
    assert catalog.pair("mine") == pair
    target = catalog.models_of(pair.variant("llamacpp"))[0]
    assert target.size_bytes == family["target"].stat().st_size
    assert target.kv_bytes_per_token == 512 and target.vocab_size == 300
    resolved = pair_files("mine", "llamacpp")
    assert (resolved.target_path, resolved.draft_path) == (family["target"], family["draft"])

    store = ModelStore(Path("unused-store"))
    assert pair_state(catalog, pair, store, "llamacpp") == "downloaded"
    rows = {row.name: row for row in pair_overview(catalog, store, MACHINE)}
    assert rows["mine"].variants[0].fit.fits  # a menu row like any other
    assert store.remove(target) == 0 and family["target"].exists()  # never deleted

    family["draft"].unlink()
    with pytest.raises(LocalModelMissingError, match="models add mine"):
        pair_files("mine", "llamacpp")
    assert forget_user_pair("mine")
    assert "mine" not in load_catalog().pair_names()


def test_a_pair_that_fails_the_vocabulary_rule_is_refused_and_a_target_alone_is_allowed(
    family: dict[str, Path],
) -> None:
    with pytest.raises(IncompatiblePairError, match=r"BOS differs.*leave out --draft"):
        add_user_pair("mixed", str(family["target"]), str(family["stranger"]))
    assert "mixed" not in load_catalog().pair_names()
    add_user_pair("alone", str(family["stranger"]), None)
    assert load_catalog().pair("alone").variants[0].draft is None


def test_names_are_checked_and_replace_is_explicit(family: dict[str, Path]) -> None:
    with pytest.raises(PairInputError, match="draftpen's own catalog"):
        add_user_pair("starter", str(family["target"]), None)
    add_user_pair("mine", str(family["target"]), None)
    with pytest.raises(PairInputError, match="--replace"):
        add_user_pair("mine", str(family["target"]), str(family["draft"]))
    add_user_pair("mine", str(family["target"]), str(family["draft"]), replace=True)
    assert load_catalog().pair("mine").variants[0].draft == "mine.draft"


def test_scan_finds_models_in_the_hf_cache_lm_studio_and_ollama_and_says_why_not(
    family: dict[str, Path], tmp_path: Path
) -> None:
    hf = tmp_path / "hf" / "hub"
    snapshot = hf / "models--org--big-GGUF" / "snapshots" / ("a" * 40)
    blob = hf / "models--org--big-GGUF" / "blobs" / ("b" * 64)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(family["target"].read_bytes())
    snapshot.mkdir(parents=True)
    (snapshot / "big-Q4.gguf").symlink_to(blob)

    lm_studio = tmp_path / "lmstudio" / "models"
    write_gguf(lm_studio / "org" / "small-GGUF" / "small-Q8.gguf", tokens=vocabulary(240))
    write_gguf(lm_studio / "org" / "small-GGUF" / "mmproj-f16.gguf", tokens=[])  # no vocab
    (lm_studio / "org" / "broken.gguf").write_text("not a model")

    ollama = tmp_path / "ollama" / "models"
    digest = "c" * 64
    ollama_blob = ollama / "blobs" / f"sha256-{digest}"
    ollama_blob.parent.mkdir(parents=True)
    ollama_blob.write_bytes(family["stranger"].read_bytes())
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "other" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {
                "layers": [
                    {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:0"},
                    {
                        "mediaType": "application/vnd.ollama.image.model",
                        "digest": f"sha256:{digest}",
                    },
                ]
            }
        )
    )

    result = scan(ScanPlaces(huggingface_cache=hf, lm_studio=(lm_studio,), ollama=ollama))
    found = {model.label: model for model in result.models}
    assert set(found) == {
        "org/big-GGUF/big-Q4.gguf",
        "org/small-GGUF/small-Q8.gguf",
        "other:latest",
    }
    assert found["other:latest"].path == ollama_blob  # read in place, not copied
    assert found["org/big-GGUF/big-Q4.gguf"].place == "Hugging Face cache"
    assert [path.name for path, _ in result.skipped] == ["broken.gguf"]

    verdicts = {
        (pairing.target.label, pairing.draft.label): pairing.check for pairing in result.pairings
    }
    assert verdicts[("org/big-GGUF/big-Q4.gguf", "org/small-GGUF/small-Q8.gguf")].compatible
    mismatch = verdicts[("org/big-GGUF/big-Q4.gguf", "other:latest")]
    assert not mismatch.compatible and "BOS differs" in (mismatch.problem or "")

    out = io.StringIO()
    pair_listing.print_scan(result, out)
    printed = out.getvalue()
    assert "can pair: draftpen models add NAME --target" in printed
    assert "cannot pair: BOS differs" in printed


def test_target_and_draft_flags_become_this_runs_pair_on_every_command(
    family: dict[str, Path],
) -> None:
    parser = main_module.build_parser()
    for command in ("chat", "generate", "serve", "bench"):
        args = parser.parse_args([command, "--target", str(family["target"])])
        assert args.target == str(family["target"]) and args.draft is None
    args = parser.parse_args(
        ["generate", "--target", str(family["target"]), "--draft", str(family["draft"])]
    )
    cli_models.apply_pair_options(args)
    assert args.pair == "big-Q4" and args.runtime == "llamacpp"
    resolved = pair_files(args.pair, "llamacpp")
    assert resolved.draft_path == family["draft"]

    with pytest.raises(DraftpenError, match="--draft needs --target"):
        cli_models.apply_pair_options(argparse.Namespace(target=None, draft="x", pair=None))
    with pytest.raises(DraftpenError, match="either --pair NAME or --target"):
        cli_models.apply_pair_options(
            argparse.Namespace(target=str(family["target"]), draft=None, pair="starter")
        )


def test_a_hub_reference_pair_is_added_pulled_and_resolved_like_a_catalog_pair(
    family: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    with FakeHub() as hub:
        hub.add_repo("org/big-GGUF", {"big-Q4.gguf": family["target"].read_bytes()})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        add_user_pair("hubbed", "org/big-GGUF:big-Q4.gguf", str(family["draft"]))
        catalog = load_catalog()
        store = ModelStore(tmp_path / "store")
        assert pair_state(catalog, catalog.pair("hubbed"), store, "llamacpp") == "partial"
        resolved = download_pair(
            catalog, "hubbed", store, runtime="llamacpp", check_tokenizers=False
        )
    assert resolved.target_path.read_bytes() == family["target"].read_bytes()
    assert resolved.draft_path == family["draft"]
    assert "models--org--big-GGUF" in str(resolved.target_path)


@pytest.mark.real_model
def test_the_real_header_reader_agrees_with_llama_cpp_and_smollm2_cannot_draft_for_qwen() -> None:
    target, draft, smollm2 = (require_model(k) for k in (TARGET_KEY, DRAFT_KEY, SMOLLM2_KEY))
    from backends.select import load_vocabulary

    for path in (target, smollm2):
        ours = read_gguf_header(path).vocab_info()
        vocabulary_of_llama_cpp = load_vocabulary(path, runtime="llamacpp")
        assert vocabulary_of_llama_cpp is not None
        theirs = vocabulary_of_llama_cpp.vocab_info()
        vocabulary_of_llama_cpp.close()  # type: ignore[attr-defined]
        assert (ours.n_vocab, ours.bos_id, ours.eos_id, ours.add_bos, ours.add_eos) == (
            theirs.n_vocab,
            theirs.bos_id,
            theirs.eos_id,
            theirs.add_bos,
            theirs.add_eos,
        )
    add_user_pair("qwen-own", str(target), str(draft))
    with pytest.raises(IncompatiblePairError) as caught:
        add_user_pair("mismatch", str(target), str(smollm2))
    message = str(caught.value)
    assert "cannot draft for" in message and "BOS differs" in message


@pytest.mark.real_model
def test_a_pair_given_by_paths_writes_what_the_catalog_pair_writes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    target, draft = require_model(TARGET_KEY), require_model(DRAFT_KEY)
    common = [
        "--prompt",
        "Write a Python function that adds two numbers.",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--drafter",
        "model",
        "--json",
    ]
    assert main_module.main(["generate", "--pair", "starter", *common]) == 0
    by_catalog = json.loads(capsys.readouterr().out)
    assert (
        main_module.main(["generate", "--target", str(target), "--draft", str(draft), *common]) == 0
    )
    by_paths = json.loads(capsys.readouterr().out)
    assert by_paths["text"] == by_catalog["text"]
    assert by_paths["stats"]["drafted"] > 0  # the draft model was used
