"""The pair recommended for a machine, in ``models list`` and on the models screen.

The catalog is the real, packaged one; the machines are described, not detected, so each
rule is checked against the figures it reads (no pair name is hard-coded as the answer).
"""

from __future__ import annotations

import dataclasses
import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from app.cli import pair_listing
from app.models.catalog_file import load_catalog, parse_catalog
from app.models.fit import MachineMemory
from app.models.overview import PairRow, pair_overview
from app.models.recommend import (
    MIN_CPU_TOKENS_PER_SECOND,
    estimated_cpu_tokens_per_second,
    recommend_pair,
)
from app.models.sources.on_this_machine import ScanPlaces
from app.models.store import ModelStore
from app.tui.models_service import ModelsService
from app.tui.screens.models import ModelsScreen
from app.tui.widgets.found_models import FoundModelsView
from tests.chat_app.tui_replies import ARTIFACTS
from tests.models.gguf_files import vocabulary, write_gguf
from tests.support.tui_helpers import (
    make_app,
    run,
    scripted_engine,
    stop_engine_servers,  # noqa: F401 (an autouse fixture)
)

GB = 10**9


def overview(tmp_path: Path, machine: MachineMemory) -> tuple[PairRow, ...]:
    return pair_overview(load_catalog(), ModelStore(tmp_path / "store"), machine)


def target_bytes(row: PairRow) -> int:
    variant = row.variant("llamacpp")
    assert variant is not None
    return variant.models[0].size_bytes


def test_with_a_gpu_the_largest_target_that_fits_the_gpu_wins(tmp_path: Path) -> None:
    machine = MachineMemory(64 * GB, gpu_name="RTX 4090", vram_bytes=24 * GB, cpu_cores=8)
    rows = overview(tmp_path, machine)
    best = recommend_pair(rows, machine, "llamacpp")
    assert best is not None
    chosen = next(row for row in rows if row.name == best.pair)
    variant = chosen.variant("llamacpp")
    assert variant is not None and variant.fit.place == "gpu"
    on_gpu = [
        row
        for row in rows
        if row.recommend and (v := row.variant("llamacpp")) and v.fit.place == "gpu"
    ]
    assert target_bytes(chosen) == max(target_bytes(row) for row in on_gpu)
    # Something bigger exists that does not fit the GPU, so the choice really was a limit.
    assert any(target_bytes(row) > target_bytes(chosen) for row in rows)
    assert "fits the GPU" in best.reason and "24.0 GB VRAM" in best.reason


def test_a_pair_the_catalog_keeps_from_recommending_is_listed_but_never_chosen(
    tmp_path: Path,
) -> None:
    machine = MachineMemory(32 * GB, gpu_name="RTX 4080", vram_bytes=16 * GB, cpu_cores=8)
    rows = overview(tmp_path, machine)
    kept_back = [row for row in rows if not row.recommend]
    assert kept_back, "the catalog marks gpt-oss-20b-eagle3 recommend = false"
    # It fits this GPU and is the largest target that does, so only the mark keeps it out.
    fitting = [row for row in rows if (v := row.variant("llamacpp")) and v.fit.place == "gpu"]
    largest = max(fitting, key=target_bytes)
    assert not largest.recommend
    best = recommend_pair(rows, machine, "llamacpp")
    assert best is not None and best.pair != largest.name
    marked = [replace_recommend(row) for row in rows]
    assert recommend_pair(marked, machine, "llamacpp").pair == largest.name  # type: ignore[union-attr]


def replace_recommend(row: PairRow) -> PairRow:
    """The row as if the catalog recommended it."""
    return dataclasses.replace(row, recommend=True)


@pytest.mark.parametrize("cores", [2, 16])
def test_on_a_cpu_the_largest_target_fast_enough_to_read_wins(tmp_path: Path, cores: int) -> None:
    machine = MachineMemory(64 * GB, cpu_cores=cores)
    rows = overview(tmp_path, machine)
    best = recommend_pair(rows, machine, "llamacpp")
    assert best is not None
    chosen = next(row for row in rows if row.name == best.pair)
    rate = estimated_cpu_tokens_per_second(target_bytes(chosen), cores)
    assert rate >= MIN_CPU_TOKENS_PER_SECOND
    fitting = [
        row for row in rows if row.recommend and (v := row.variant("llamacpp")) and v.fit.fits
    ]
    bigger = [row for row in fitting if target_bytes(row) > target_bytes(chosen)]
    assert bigger  # 64 GB holds bigger pairs: the speed estimate is what ruled them out
    assert all(
        estimated_cpu_tokens_per_second(target_bytes(row), cores) < MIN_CPU_TOKENS_PER_SECOND
        for row in bigger
    )
    assert f"on {cores} cores" in best.reason
    # Sixteen cores can afford a bigger target than two.
    if cores == 16:
        two = recommend_pair(rows, MachineMemory(64 * GB, cpu_cores=2), "llamacpp")
        assert two is not None
        small = next(row for row in rows if row.name == two.pair)
        assert target_bytes(chosen) > target_bytes(small)


def test_nothing_is_recommended_where_nothing_fits(tmp_path: Path) -> None:
    machine = MachineMemory(100_000_000, cpu_cores=2)
    assert recommend_pair(overview(tmp_path, machine), machine, "llamacpp") is None


def test_models_list_marks_the_recommended_pair_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = MachineMemory(24 * GB, cpu_cores=2)
    monkeypatch.setattr(pair_listing, "machine_memory", lambda: machine)
    monkeypatch.setattr(pair_listing, "choose_runtime", lambda _: "llamacpp")
    best = recommend_pair(overview(tmp_path, machine), machine, "llamacpp")
    assert best is not None
    out = io.StringIO()
    with redirect_stdout(out):
        assert pair_listing.list_pairs(None) == 0  # type: ignore[arg-type]
    printed = out.getvalue()
    assert f"Recommended here: {best.pair} (llamacpp), {best.reason}." in printed
    starred = [line for line in printed.splitlines() if "* recommended" in line]
    assert len(starred) == 1 and starred[0].startswith(best.pair)


def test_the_models_screen_stars_the_pair_and_lists_gguf_files_found_here(
    tmp_path: Path,
) -> None:
    lm_studio = tmp_path / "lmstudio"
    write_gguf(lm_studio / "org" / "big-GGUF" / "big-Q4.gguf", padding=40_000)
    write_gguf(lm_studio / "org" / "small-GGUF" / "small-Q8.gguf", tokens=vocabulary(240))
    write_gguf(
        lm_studio / "org" / "other-GGUF" / "other-Q8.gguf",
        architecture="llama",
        tokens=vocabulary(300, "w"),
        bos=7,
        eos=8,
    )
    machine = MachineMemory(24 * GB, cpu_cores=2)
    service = ModelsService(
        store=ModelStore(tmp_path / "store"),
        runtime="llamacpp",
        machine=machine,
        scan_places=ScanPlaces(huggingface_cache=None, lm_studio=(lm_studio,), ollama=None),
    )
    app = make_app({"fake": scripted_engine(["ok"])}, models_service=lambda: service)

    async def body() -> None:
        async with app.run_test(size=(150, 48)) as pilot:
            for _ in range(100):
                await pilot.pause()
                if app.ready:
                    break
            await pilot.press("ctrl+o")
            screen = app.screen
            assert isinstance(screen, ModelsScreen)
            found = screen.query_one(FoundModelsView)
            for _ in range(400):  # the scan runs in a worker
                await app.workers.wait_for_complete()
                await pilot.pause(0.02)
                if found.query_one("#found").row_count:  # type: ignore[attr-defined]
                    break
            best = service.recommendation
            assert best is not None
            table = screen.query_one("#pairs")
            names = [str(table.get_row_at(index)[0]) for index in range(table.row_count)]  # type: ignore[attr-defined]
            assert [name.strip() for name in names if "★" in name] == [f"{best.pair} ★"]
            assert best.reason in str(screen.query_one("#recommendation").render())

            rows = found.query_one("#found")
            labels = {str(rows.get_row_at(i)[1]) for i in range(rows.row_count)}  # type: ignore[attr-defined]
            assert labels == {
                "org/big-GGUF/big-Q4.gguf",
                "org/small-GGUF/small-Q8.gguf",
                "org/other-GGUF/other-Q8.gguf",
            }
            verdicts = str(found.query_one("#found-pairs").render())
            assert "can pair: draftpen models add NAME --target" in verdicts
            assert "cannot pair: BOS differs" in verdicts
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            app.save_screenshot(str(ARTIFACTS / "models-recommended-and-found.svg"))

    run(body)


def test_a_24_gb_gpu_gets_qwen3_6_27b_q4_drafting_with_its_own_mtp_head(tmp_path: Path) -> None:
    machine = MachineMemory(64 * GB, gpu_name="RTX 4090", vram_bytes=24 * GB, cpu_cores=8)
    rows = overview(tmp_path, machine)
    best = recommend_pair(rows, machine, "llamacpp")
    assert best is not None
    chosen = next(row for row in rows if row.name == best.pair)
    variant = chosen.variant("llamacpp")
    assert variant is not None
    target = variant.models[0].entry
    # The advice, read from the catalog's figures: a Qwen3.6 27B at Q4 whose own
    # MTP head drafts (the GGUF keeps its nextn layer), on the GPU.
    assert variant.variant.uses_mtp and variant.variant.draft is None
    assert target.architecture == "qwen35" and target.mtp_layers
    assert "Q4" in target.name and "27B" in target.name
    assert variant.fit.place == "gpu"
    assert "with its own MTP head" in best.reason


MTP_AND_PLAIN = """
[models.plain]
name = "Plain 20B"
format = "gguf"
architecture = "qwen35"
size_bytes = 12_000_000_000

[models.plain.sources.huggingface]
repo = "org/plain-GGUF"
filename = "plain.gguf"

[models.with-head]
name = "Same 20B, MTP layer kept"
format = "gguf"
architecture = "qwen35"
size_bytes = 12_000_000_000
mtp_layers = 1

[models.with-head.sources.huggingface]
repo = "org/mtp-GGUF"
filename = "mtp.gguf"

[pairs.no-drafter]
description = "n-grams only"

[pairs.no-drafter.llamacpp]
target = "plain"

[pairs.own-head]
description = "its own MTP head"

[pairs.own-head.llamacpp]
target = "with-head"
drafter = "mtp"
"""


def test_between_equal_targets_the_one_whose_mtp_head_drafts_wins(tmp_path: Path) -> None:
    # The pair without a drafter comes first: a tie broken by order would pick it.
    catalog = parse_catalog(MTP_AND_PLAIN, "mtp.toml")
    machine = MachineMemory(64 * GB, gpu_name="RTX 4090", vram_bytes=24 * GB, cpu_cores=8)
    rows = pair_overview(catalog, ModelStore(tmp_path / "store"), machine)
    best = recommend_pair(rows, machine, "llamacpp")
    assert best is not None and best.pair == "own-head"
    assert "with its own MTP head" in best.reason
