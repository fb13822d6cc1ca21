"""``draftpen bench``: the report's arithmetic, and a real short run on SmolLM2."""

from __future__ import annotations

import json

import pytest

from app.bench.modes import (
    BenchMode,
    LocalDecoder,
    ModeTotals,
    bench_modes,
    paired_ratios,
    parse_mode_choice,
    run_modes,
)
from app.bench.report import projected_speedup
from app.bench.suite import BenchPrompt, load_prompt_suite
from app.errors import DraftpenError
from backends.engine import Engine
from backends.speculation.cost_model import CostModel
from tests.support.draftpen_cli import run_draftpen
from tests.support.fakes import HashModel, draft_model_for
from tests.support.model_files import SMOLLM2_KEY, require_model


def test_prompt_suite_has_the_four_categories():
    categories = {prompt.category for prompt in load_prompt_suite()}
    assert {"chat", "code", "json", "code_edit"} <= categories


def test_unknown_category_is_refused_naming_the_known_ones():
    with pytest.raises(DraftpenError, match="code_edit"):
        load_prompt_suite(["poetry"])


def test_projection_charges_draft_model_steps_but_not_ngram_lookups():
    # 120 tokens in 40 target passes, 4 drafted per pass.
    totals = ModeTotals(generated_tokens=120, target_passes=40, drafted=160)
    plain = ModeTotals(generated_tokens=120, target_passes=120)  # no host time measured
    assert projected_speedup(totals, plain, 0.25, "model") == pytest.approx(3.0 / 2.0)
    assert projected_speedup(totals, plain, 0.25, "ngram") == pytest.approx(3.0)
    assert projected_speedup(ModeTotals(), plain, 0.25, "model") is None


def test_projection_charges_the_loops_host_time_on_top_of_each_step():
    # n-gram: 3 tokens per pass; the loop spends 2.5 ms a pass, plain decoding 0.
    totals = ModeTotals(generated_tokens=120, target_passes=40, drafted=160, host_seconds=0.1)
    plain = ModeTotals(generated_tokens=120, target_passes=120)
    assert totals.host_ms_per_token == pytest.approx(100 / 120)
    # 3 tokens in 7.5 + 2.5 ms against 7.5 ms a token: 2.25x, not 3x.
    assert projected_speedup(totals, plain, 0.25, "ngram", 0.0075) == pytest.approx(2.25)
    # Plain decoding's own host time raises the baseline alike.
    slow_plain = ModeTotals(generated_tokens=120, target_passes=120, host_seconds=0.3)
    assert projected_speedup(totals, slow_plain, 0.25, "ngram", 0.0075) == pytest.approx(
        3 * 0.01 / 0.01
    )


class RecordingYardstick:
    """An outside decoder that notes when it ran and claims a fixed speed."""

    def __init__(self, name: str, order: list[str]) -> None:
        self.name = name
        self.order = order

    def decode_speed(self, prompt_tokens, max_tokens):
        self.order.append(self.name)
        return max_tokens, max_tokens / 50.0

    def close(self) -> None:
        pass


def test_modes_rotate_so_each_takes_every_place_in_the_order(monkeypatch):
    import app.bench.modes as bench

    order: list[str] = []
    real_run_mode = bench._run_mode

    def recording_run_mode(engine, mode, *arguments):
        order.append(mode.label)
        return real_run_mode(engine, mode, *arguments)

    monkeypatch.setattr(bench, "_run_mode", recording_run_mode)
    target = HashModel()
    engine = Engine(target, draft_model_for(target), costs=CostModel({1: 0.02, 4: 0.021}, 0.004))
    modes = [BenchMode("plain", "none", 0), BenchMode("auto", "auto", 0)]
    yardstick = RecordingYardstick("outside", order)
    prompts = [BenchPrompt("code", "the cat sat on the mat"), BenchPrompt("chat", "hello there")]
    results = run_modes(
        LocalDecoder(engine),
        prompts,
        modes,
        max_tokens=6,
        repeats=3,
        yardsticks=[yardstick],
        progress=False,
    )
    order = order[3:]  # the untimed warm-up runs each once, in the listed order
    runs = [order[i : i + 3] for i in range(0, len(order), 3)]
    assert len(runs) == 6
    assert [run[0] for run in runs] == ["plain", "auto", "outside"] * 2
    assert all(sorted(run) == ["auto", "outside", "plain"] for run in runs)
    # Three runs per category (one per repeat), each paired with plain's run.
    assert len(results["code"]["auto"].run_rates) == 3
    ratios = paired_ratios(results["code"], "outside")
    plain_rates = results["code"]["plain"].run_rates
    assert ratios == pytest.approx([50.0 / rate for rate in plain_rates])


def test_totals_add_runs_and_keep_each_runs_speed():
    totals = ModeTotals()
    totals.add(ModeTotals.of_run(10, 2.0, drafted=4, accepted=3))
    totals.add(ModeTotals.of_run(30, 2.0, target_passes=7))
    assert totals.tokens_per_second == pytest.approx(10.0)
    assert totals.run_rates == pytest.approx([5.0, 15.0])
    assert (totals.drafted, totals.accepted, totals.target_passes) == (4, 3, 7)
    assert totals.speedup_over_own_plain_rounds is None  # no plain rounds to compare with
    # 40 tokens in 4 s, 20 of them from plain rounds that took 0.15 s each: 40 tokens
    # at that pace would have taken 6 s.
    totals.add(ModeTotals(plain_rounds=20, plain_round_seconds=3.0))
    assert totals.speedup_over_own_plain_rounds == pytest.approx(1.5)
    few = ModeTotals()
    few.add(ModeTotals.of_run(10, 1.0, plain_rounds=5, plain_round_seconds=0.5))
    assert few.speedup_over_own_plain_rounds is None  # too few rounds to judge by


def test_modes_option_picks_groups_and_refuses_unknown_ones():
    assert parse_mode_choice(None) == {"draft", "ngram", "auto", "reference"}
    chosen = parse_mode_choice("auto, reference")
    labels = [mode.label for mode in bench_modes(chosen, has_draft=True, exact=True)]
    assert labels == ["plain", "auto", "auto, exact"]
    all_labels = [m.label for m in bench_modes(parse_mode_choice(""), has_draft=False, exact=False)]
    assert all_labels == ["plain", "n-gram K=10", "auto"]  # no draft model, no draft modes
    with pytest.raises(DraftpenError, match="Choose from draft, ngram, auto, reference"):
        parse_mode_choice("auto,turbo")


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
    assert modes["auto"]["paired_ratios"] and "per run" in result.stdout
    assert "vs own" in result.stdout
    assert all(mode["generated_tokens"] > 0 for mode in modes.values())
    assert report["costs_ms"]["target_forward"]["1"] > 0
    assert "ceiling" in result.stdout and "projected" in result.stdout
    assert output.with_suffix(".txt").read_text().strip()


def test_the_constrained_categories_carry_a_schema_or_tools():
    prompts = load_prompt_suite(["json_schema", "tool_call"])
    assert {p.category for p in prompts} == {"json_schema", "tool_call"}
    assert all(p.constrained for p in prompts)
    assert all(p.schema["type"] == "object" for p in prompts if p.category == "json_schema")
    assert all(len(p.tools) == 2 for p in prompts if p.category == "tool_call")
    assert not any(p.constrained for p in load_prompt_suite(["chat", "code"]))


def test_constrained_prompts_add_plain_decoding_without_the_grammar():
    chosen = parse_mode_choice(None)
    labels = [m.label for m in bench_modes(chosen, has_draft=True, exact=False, constrained=True)]
    assert labels[:2] == ["plain", "plain, no grammar"]
    unconstrained = bench_modes(chosen, has_draft=True, exact=False)
    assert "plain, no grammar" not in [m.label for m in unconstrained]
