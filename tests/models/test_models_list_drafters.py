"""``draftpen models list`` says what drafts in each pair, in its table and in ``--json``,
run as a user runs it (a subprocess of the CLI, against the packaged catalog)."""

from __future__ import annotations

import json
from pathlib import Path

from app.models.catalog_file import load_catalog
from tests.support.draftpen_cli import run_draftpen

# What each kind of pair drafts with, as the catalog declares it.
EXPECTED_DRAFTERS = {
    "starter": "model",
    "smollm2": "ngram",
    "qwen3.6-27b": "mtp",
    "gemma4-12b": "mtp",
    "gpt-oss-20b-eagle3": "eagle3",
    "qwen3-8b-dflash": "dflash",
    "qwen3-8b-dspark": "dspark",
}


def test_models_list_shows_each_pairs_drafter_in_the_table_and_the_json(tmp_path: Path) -> None:
    env = {"DRAFTPEN_MODELS_DIR": str(tmp_path)}
    table = run_draftpen("models", "list", env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert any(line.split()[:3] == ["runtime", "drafter", "state"] for line in lines)
    for pair, drafter in EXPECTED_DRAFTERS.items():
        header = next(line for line in lines if line.split()[:1] == [pair])
        llamacpp = lines[lines.index(header) + 1].split()
        assert llamacpp[:3] == ["llamacpp", drafter, "absent"], (pair, llamacpp)
    # The head of a head pair is listed as a head, not as a draft model.
    dflash = lines.index(next(line for line in lines if line.startswith("qwen3-8b-dflash ")))
    assert lines[dflash + 3].split()[:2] == ["head", "Qwen3-8B"]

    data = run_draftpen("models", "list", "--json", env=env)
    assert data.returncode == 0, data.stderr
    listing = json.loads(data.stdout)
    pairs = {pair["name"]: pair for pair in listing["pairs"]}
    assert list(pairs) == list(load_catalog().pair_names())
    for pair, drafter in EXPECTED_DRAFTERS.items():
        variants = {variant["runtime"]: variant for variant in pairs[pair]["variants"]}
        assert variants["llamacpp"]["drafter"] == drafter, pair
        # MLX runs no head: a head pair's MLX variant drafts with n-grams.
        if drafter not in ("model", "ngram"):
            assert variants["mlx"]["drafter"] == "ngram", pair
    eagle3 = next(v for v in pairs["gpt-oss-20b-eagle3"]["variants"] if v["runtime"] == "llamacpp")
    assert [model["role"] for model in eagle3["models"]] == ["target", "head"]
    assert eagle3["models"][1]["architecture"] == "eagle3"
    assert "EAGLE-3 head" in eagle3["drafting"]
    assert listing["model_store"] == str(tmp_path)
