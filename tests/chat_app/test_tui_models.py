"""The models screen, driven by the pilot, downloading from a local hub over a real socket."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest

from app.models.catalog_file import parse_catalog
from app.models.fit import MachineMemory
from app.models.pair_download import PullEventCallback
from app.models.pair_files import resolve_pair
from app.models.store import ModelStore
from app.tui.models_service import ModelsService
from app.tui.screens.models import ModelsScreen
from tests.chat_app.tui_replies import ARTIFACTS
from tests.models.hub_pairs import (
    DRAFT_FILE,
    DRAFT_REPO,
    DRAFT_SIZE,
    TARGET_FILE,
    TARGET_REPO,
    TARGET_SIZE,
    catalog_text,
)
from tests.support.hub_server import FakeHub
from tests.support.tui_helpers import (
    make_app,
    run,
    scripted_engine,
    stop_engine_servers,  # noqa: F401 (an autouse fixture)
)

GIB = 2**30


class GatedModelsService(ModelsService):
    """The real service; optionally stops a download part-way until it is cancelled."""

    def __init__(self, *args: object, gate_after_bytes: int | None = None, **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate_after_bytes = gate_after_bytes
        self.gate_reached = threading.Event()

    def download(
        self, pair_name: str, on_event: PullEventCallback, cancel: threading.Event
    ) -> None:
        def gated(event):  # type: ignore[no-untyped-def]
            on_event(event)
            if self.gate_after_bytes is not None and event.overall_done > self.gate_after_bytes:
                self.gate_reached.set()
                cancel.wait(timeout=30)  # until the person presses Esc

        super().download(pair_name, gated, cancel)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    generator = random.Random(11)
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    with FakeHub() as server:
        server.add_repo(TARGET_REPO, {TARGET_FILE: b"GGUF" + generator.randbytes(TARGET_SIZE - 4)})
        server.add_repo(DRAFT_REPO, {DRAFT_FILE: b"GGUF" + generator.randbytes(DRAFT_SIZE - 4)})
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def service_for(tmp_path: Path, *, ram: int = 16 * GIB, **kwargs: object) -> GatedModelsService:
    service = GatedModelsService(
        catalog=parse_catalog(catalog_text(), "test.toml"),
        store=ModelStore(tmp_path / "store"),
        runtime="llamacpp",
        machine=MachineMemory(ram_bytes=ram),
        check_tokenizers=False,  # the fake hub's files are random bytes, not GGUF
        **kwargs,
    )
    return service


def cell_texts(screen: ModelsScreen, pair: str) -> list[str]:
    table = screen.query_one("#pairs")
    return [str(cell) for cell in table.get_row(pair)]  # type: ignore[attr-defined]


async def open_models(app, pilot) -> ModelsScreen:  # type: ignore[no-untyped-def]
    for _ in range(100):
        await pilot.pause()
        if app.ready:
            break
    await pilot.press("ctrl+o")
    await pilot.pause()
    assert isinstance(app.screen, ModelsScreen)
    return app.screen


async def wait_for_download(screen: ModelsScreen, pilot) -> None:  # type: ignore[no-untyped-def]
    for _ in range(400):
        await pilot.pause(0.02)
        if screen.downloading is None:
            return
    raise AssertionError(f"download never ended: {screen.last_outcome}")


def test_the_models_screen_shows_states_and_fit_verdicts(hub: FakeHub, tmp_path: Path) -> None:
    roomy = make_app(
        {"fake": scripted_engine(["ok"])}, models_service=lambda: service_for(tmp_path)
    )
    cramped = make_app(
        {"fake": scripted_engine(["ok"])},
        models_service=lambda: service_for(tmp_path, ram=1_000_000),
    )

    async def body(app, fits: bool) -> None:  # type: ignore[no-untyped-def]
        async with app.run_test(size=(140, 40)) as pilot:
            screen = await open_models(app, pilot)
            name, state, sizes, fit, description = cell_texts(screen, "tiny")
            assert "tiny" in name and description == "Two tiny hub models."
            assert sizes == "3.0 MB + 1.5 MB"
            assert state == "absent"
            assert fit.startswith("fits RAM") if fits else fit.startswith("too big")

    run(lambda: body(roomy, True))
    run(lambda: body(cramped, False))


def test_download_cancel_resume_and_delete_from_the_models_screen(
    hub: FakeHub, tmp_path: Path
) -> None:
    service = service_for(tmp_path, gate_after_bytes=1_000_000)
    app = make_app({"fake": scripted_engine(["ok"])}, models_service=lambda: service)

    async def body() -> None:
        async with app.run_test(size=(140, 40)) as pilot:
            screen = await open_models(app, pilot)
            screen.select_pair("tiny")
            await pilot.press("d")
            assert await _wait_event(service.gate_reached, pilot)
            await pilot.pause()
            assert screen.query_one("#overall-bar").percentage > 0  # type: ignore[attr-defined]
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            app.save_screenshot(str(ARTIFACTS / "models-downloading.svg"))
            await pilot.press("escape")  # cancel, from the keyboard
            await wait_for_download(screen, pilot)
            assert "cancelled" in screen.last_outcome
            assert cell_texts(screen, "tiny")[1] == "partial"
            kept = sum(
                path.stat().st_size for path in service.store.hub_cache.root.rglob("*.incomplete")
            )
            assert kept > 1_000_000

            service.gate_after_bytes = None
            await pilot.press("enter")  # not downloaded: Enter downloads (and resumes)
            await wait_for_download(screen, pilot)
            assert "downloaded and checked" in screen.last_outcome
            assert cell_texts(screen, "tiny")[1] == "downloaded"
            assert hub.file_gets(TARGET_FILE)[-1].range == f"bytes={kept}-"
            assert screen.query_one("#overall-bar").percentage == 1.0  # type: ignore[attr-defined]
            resolve_pair(service.catalog, "tiny", service.store, "llamacpp")

            await pilot.press("delete")
            await pilot.pause()
            await pilot.press("y")
            await pilot.pause()
            assert "freed 4.5 MB" in screen.last_outcome
            assert cell_texts(screen, "tiny")[1] == "absent"

    run(body)


async def _wait_event(event: threading.Event, pilot) -> bool:  # type: ignore[no-untyped-def]
    for _ in range(400):
        if event.is_set():
            return True
        await pilot.pause(0.02)
    return event.is_set()


def test_the_engines_word_on_served_and_loaded_pairs_overrides_the_files() -> None:
    from app.client.wire import PairCard
    from app.tui.screens.models import merge_engine_pairs
    from tests.support.tui_helpers import FakeModelsService

    rows = FakeModelsService().rows()  # fake, other: downloaded; missing: absent
    assert merge_engine_pairs(rows, None) == rows  # no engine: the files say it all
    served = [
        PairCard(id="other", loaded=True, target="t"),
        PairCard(id="theirs", loaded=False, target="big.gguf", draft="small.gguf"),
    ]
    merged = {row.name: row for row in merge_engine_pairs(rows, served)}
    # What the engine serves is downloaded, what it holds is loaded; the rest keeps
    # what this machine's files say (a pair the engine does not serve: not loadable).
    assert {name: row.state for name, row in merged.items()} == {
        "fake": "downloaded",
        "other": "loaded",
        "missing": "absent",
        "theirs": "downloaded",
    }
    assert merged["other"].usable and not merged["missing"].usable
    # A pair only the engine knows is listed, named by its models, with no sizes.
    assert merged["theirs"].description == "served by the engine: big.gguf + small.gguf"
    assert merged["theirs"].sizes == "" and merged["theirs"].usable
