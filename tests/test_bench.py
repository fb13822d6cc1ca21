"""``draftpen bench``: the report's arithmetic, and a real short run on SmolLM2."""

from __future__ import annotations

import json

import pytest

from app.bench import ModeTotals, load_prompt_suite, projected_speedup
from app.errors import DraftpenError
from tests.model_files import SMOLLM2_KEY, require_model
from tests.test_cli_generate import run_draftpen


def test_prompt_suite_has_the_four_categories():
    categories = {prompt.category for prompt in load_prompt_suite()}
    assert {"chat", "code", "json", "code_edit"} <= categories


def test_unknown_category_is_refused_naming_the_known_ones():
    with pytest.raises(DraftpenError, match="code_edit"):
        load_prompt_suite(["poetry"])


def test_projection_charges_draft_model_steps_but_not_ngram_lookups():
    # 120 tokens in 40 target passes, 4 drafted per pass.
    totals = ModeTotals(generated_tokens=120, target_passes=40, drafted=160)
    assert projected_speedup(totals, 0.25, "model") == pytest.approx(3.0 / 2.0)
    assert projected_speedup(totals, 0.25, "ngram") == pytest.approx(3.0)
    assert projected_speedup(ModeTotals(), 0.25, "model") is None


@pytest.mark.real_model
def test_bench_runs_every_mode_and_writes_results(tmp_path):
    require_model(SMOLLM2_KEY)
    output = tmp_path / "results" / "smollm2.json"
    result = run_draftpen(
        "bench",
        "--pair",
        "smollm2",
        "--max-tokens",
        "24",
        "--category",
        "code_edit",
        "--exact",
        "--output",
        str(output),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(output.read_text())
    modes = report["results"]["code_edit"]
    assert {"plain", "n-gram K=10", "auto", "auto, exact", "llama-cpp-python"} <= set(modes)
    assert report["exact_batch_limit"] >= 1 and "bit-identical" in result.stdout
    assert modes["plain"]["ratio_to_plain"] == pytest.approx(1.0)
    assert all(mode["generated_tokens"] > 0 for mode in modes.values())
    assert report["costs_ms"]["target_forward"]["1"] > 0
    assert "ceiling" in result.stdout and "projected" in result.stdout
    assert output.with_suffix(".txt").read_text().strip()
