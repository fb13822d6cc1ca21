"""MLX variants in the store: the GGUF fetched and converted, the directory marked complete
(and never used without its marker or with a changed file), a failed or unavailable
conversion leaving nothing, the variant removed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import (
    ChecksumMismatchError,
    DownloadError,
    ModelNotDownloadedError,
)
from app.models.disk import format_bytes
from app.models.downloads import pull_pair
from app.models.pair_files import resolve_pair
from app.models.sources.conversion import GGUFConversionSource
from app.models.store import CONVERTED_MARKER, ProgressStage
from tests.models.wheel_mirror import (
    MLX_DRAFT,
    MLX_TARGET,
    TARGET,
    WheelMirror,
    run_cli,
)

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
