"""``draftpen models list`` says what drafts in each pair, in its table and in ``--json``,
run as a user runs it (a subprocess of the CLI, against the packaged catalog)."""

from __future__ import annotations

import json
from pathlib import Path

from app.models.catalog_file import load_catalog
from tests.support.draftpen_cli import run_draftpen

# What each kind of pair drafts with, per runtime, as the catalog declares it (None: the
# pair has no variant for that runtime).
EXPECTED_DRAFTERS = {
    "starter": {"llamacpp": "model", "mlx": "model"},
    "smollm2": {"llamacpp": "ngram", "mlx": "ngram"},
    # mlx-lm runs no MTP head: on MLX these drafts are n-grams.
    "qwen3.6-27b": {"llamacpp": "mtp", "mlx": "ngram"},
    "gemma4-12b": {"llamacpp": "mtp", "mlx": "ngram"},
    # gpt-oss is refused on MLX (sliding-window layers); MLX runs no DSpark head.
    "gpt-oss-20b-eagle3": {"llamacpp": "eagle3", "mlx": "ngram"},
    "qwen3-8b-dflash": {"llamacpp": "dflash", "mlx": "dflash"},
    "qwen3-8b-dspark": {"llamacpp": "dspark", "mlx": "ngram"},
    # EAGLE-3 heads published only as Hugging Face directories: MLX only.
    "qwen3-8b-eagle3": {"llamacpp": None, "mlx": "eagle3"},
    "llama-8b-eagle3": {"llamacpp": None, "mlx": "eagle3"},
}


def test_models_list_shows_each_pairs_drafter_in_the_table_and_the_json(tmp_path: Path) -> None:
    env = {"DRAFTPEN_MODELS_DIR": str(tmp_path)}
    table = run_draftpen("models", "list", env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert any(line.split()[:3] == ["runtime", "drafter", "state"] for line in lines)
    for pair, drafters in EXPECTED_DRAFTERS.items():
        header = lines.index(next(line for line in lines if line.split()[:1] == [pair]))
        # Each variant's row, up to the blank line before the next pair's header.
        end = next((i for i in range(header, len(lines)) if not lines[i]), len(lines))
        block = lines[header + 1 : end]
        rows = {
            row.split()[0]: row.split() for row in block if row.startswith("  ") and row[2] != " "
        }
        for runtime, drafter in drafters.items():
            if drafter is None:
                assert runtime not in rows, (pair, rows)
            else:
                assert rows[runtime][1:3] == [drafter, "absent"], (pair, rows[runtime])
    # The head of a head pair is listed as a head, not as a draft model.
    dflash = lines.index(next(line for line in lines if line.startswith("qwen3-8b-dflash ")))
    assert lines[dflash + 3].split()[:2] == ["head", "Qwen3-8B"]

    data = run_draftpen("models", "list", "--json", env=env)
    assert data.returncode == 0, data.stderr
    listing = json.loads(data.stdout)
    pairs = {pair["name"]: pair for pair in listing["pairs"]}
    assert list(pairs) == list(load_catalog().pair_names())
    for pair, drafters in EXPECTED_DRAFTERS.items():
        variants = {variant["runtime"]: variant for variant in pairs[pair]["variants"]}
        assert {
            runtime: variants[runtime]["drafter"] if runtime in variants else None
            for runtime in drafters
        } == drafters, pair
    # An MLX head is its Hugging Face directory, listed as the variant's head.
    mlx = next(v for v in pairs["qwen3-8b-dflash"]["variants"] if v["runtime"] == "mlx")
    assert [(m["role"], m["architecture"]) for m in mlx["models"]] == [
        ("target", "qwen3"),
        ("head", "dflash"),
    ]
    assert "through mlx-vlm" in mlx["drafting"]
    eagle3 = next(v for v in pairs["gpt-oss-20b-eagle3"]["variants"] if v["runtime"] == "llamacpp")
    assert [model["role"] for model in eagle3["models"]] == ["target", "head"]
    assert eagle3["models"][1]["architecture"] == "eagle3"
    assert "EAGLE-3 head" in eagle3["drafting"]
    assert listing["model_store"] == str(tmp_path)
