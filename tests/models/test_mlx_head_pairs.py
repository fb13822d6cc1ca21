"""A catalog pair whose ``mlx`` variant drafts with a head, loaded as a user loads it: the
catalog names the target and the head's directory, the store holds both, and
``load_engine`` attaches the head to the MLX target, which then drafts with it.

Tiny random-weight targets and heads in their publishers' formats
(tests/support/tiny_mlx_heads.py); random weights accept little, so only that the head
drafted is asserted, not how well.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.loading import load_engine
from backends.engine_slots import EngineSlots
from backends.runtime_exchange import RuntimeExchange
from tests.runtimes.tiny_mlx_pair import mlx_pair_catalog, store_converted
from tests.support.head_pairs import check_loaded_head_drafts

PAIR = "tiny-heads"


def catalog_text(drafter: str, architecture: str) -> str:
    """A catalog whose one pair's mlx variant drafts with ``drafter``'s head."""
    return mlx_pair_catalog(PAIR, "tiny-target", "tiny-head", architecture, drafter=drafter)


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("drafter", "architecture", "loaded"),
    [("eagle3", "llama", "EAGLE-3 head"), ("dflash", "qwen3", "DFlash/DSpark head")],
)
def test_a_catalog_mlx_head_pair_loads_and_drafts_with_its_head(
    drafter: str, architecture: str, loaded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_tiny_head_pair(tmp_path, monkeypatch, drafter, architecture)
    messages: list[str] = []
    engine = load_engine(
        PAIR, n_ctx=256, runtime="mlx", calibrate=False, on_progress=messages.append
    )
    check_loaded_head_drafts(engine, messages, loaded, drafter)


def store_tiny_head_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drafter: str, architecture: str
) -> None:
    """A catalog of the tiny MLX pair drafting with ``drafter``'s head, its files stored."""
    pytest.importorskip("mlx_vlm", reason="mlx-vlm runs the heads on MLX")
    from tests.support import tiny_mlx_heads

    # Built before the store moves: the target borrows SmolLM2's tokenizer from the store.
    target = tiny_mlx_heads.write_mlx_target(
        tmp_path / "built" / "target", seed=1, arch=architecture
    )
    write_head = getattr(tiny_mlx_heads, f"write_{drafter}_head")
    head = write_head(tmp_path / "built" / "head", seed=2)
    catalog = tmp_path / "models.toml"
    catalog.write_text(catalog_text(drafter, architecture))
    monkeypatch.setenv("DRAFTPEN_CATALOG", str(catalog))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(tmp_path / "models"))
    store_converted(tmp_path / "models", {"tiny-target": target, "tiny-head": head})


@pytest.mark.real_model
def test_a_head_pair_serves_several_sequences_each_drafting_with_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--parallel 2`` loads a head pair for two sequences, and each slot drafts with a
    head state of its own (nothing says the pair fell back to n-grams)."""
    store_tiny_head_pair(tmp_path, monkeypatch, "eagle3", "llama")
    messages: list[str] = []
    engine = load_engine(
        PAIR, n_ctx=256, runtime="mlx", calibrate=False, parallel=2, on_progress=messages.append
    )
    exchange = RuntimeExchange()
    stop = threading.Event()
    runtime = threading.Thread(target=exchange.serve, args=(stop,), daemon=True)
    runtime.start()
    slots = EngineSlots(engine, exchange)
    try:
        assert engine.target.parallel == 2  # type: ignore[attr-defined]
        assert not any("n-grams instead" in message for message in messages), messages
        heads = [slots.take([]).drafter_named("eagle3").head for _ in range(2)]
        assert heads[0].head is not heads[1].head  # type: ignore[attr-defined]
    finally:
        exchange.stop_serving(stop)
        runtime.join(timeout=10)
        slots.close()
        engine.close()
