"""``serve --mlx-split`` and the rules of a split target, without a model or mlx.

What ``serve`` under ``mlx.launch`` refuses before it joins a group, and how rank 0's
scheduler keeps the one pair every rank holds. Two ranks serving for real:
tests/runtimes/test_mlx_split_serve.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from app.engine.mlx_split import SplitScheduler, rank_split
from app.engine.scheduler import LoadOptions
from app.engine.schema import ApiError
from app.errors import DraftpenError
from backends.engine import Engine
from tests.support.draftpen_cli import assert_clean_error, run_draftpen
from tests.support.fakes import HashModel

OPTIONS = LoadOptions(context_length=256, exact=False)


def _serve_args(**given: object) -> argparse.Namespace:
    """``serve``'s arguments that rank_split reads."""
    defaults: dict[str, object] = {
        "mlx_split": None,
        "runtime": "mlx",
        "pair": "p",
        "workers": None,
    }
    return argparse.Namespace(**{**defaults, **given})


def test_a_plain_serve_is_no_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLX_RANK", raising=False)
    assert rank_split(_serve_args()) is None


def test_mlx_split_outside_mlx_launch_says_how_to_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLX_RANK", raising=False)
    result = run_draftpen("serve", "--runtime", "mlx", "--mlx-split", "tensor", "--pair", "p")
    assert_clean_error(result, "--mlx-split", "mlx.launch --backend ring --hostfile")


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ({"pair": None}, "needs --pair"),
        ({"runtime": "llamacpp"}, "Add --runtime mlx"),
        ({"workers": "10.0.0.2:50052"}, "do not mix"),
    ],
)
def test_a_rank_refuses_what_the_split_cannot_do_before_it_joins(
    monkeypatch: pytest.MonkeyPatch, given: dict[str, object], fragment: str
) -> None:
    monkeypatch.setenv("MLX_RANK", "0")
    with pytest.raises(DraftpenError, match=fragment):
        rank_split(_serve_args(**given))


def _never_loads(name: str, options: LoadOptions, report: Callable[[str], None]) -> Engine:
    raise AssertionError("a split target is never loaded again")


def _scheduler() -> SplitScheduler:
    scheduler = SplitScheduler(_never_loads, OPTIONS, ranks=2)
    scheduler.adopt("pair", Engine(HashModel()), OPTIONS)
    return scheduler


def test_the_split_pair_is_served_as_held() -> None:
    scheduler = _scheduler()
    loaded, fresh = scheduler.acquire("pair", None, lambda text: None)
    assert loaded.name == "pair" and not fresh
    assert scheduler.acquire("pair", OPTIONS, lambda text: None)[0] is loaded
    assert scheduler.keep_alive is None  # never unloaded for idling: that ends the ranks


@pytest.mark.parametrize(
    ("name", "options"),
    [("other", None), ("pair", LoadOptions(context_length=512, exact=False))],
)
def test_another_pair_or_other_options_are_refused_and_the_pair_stays(
    name: str, options: LoadOptions | None
) -> None:
    scheduler = _scheduler()
    with pytest.raises(ApiError) as refused:
        scheduler.acquire(name, options, lambda text: None)
    assert refused.value.status == 409 and "split across 2 ranks" in str(refused.value)
    assert scheduler.loaded_name() == "pair"


def test_once_unloaded_the_split_pair_is_gone() -> None:
    scheduler = _scheduler()
    scheduler.unload("the test")
    with pytest.raises(ApiError, match="start it again"):
        scheduler.acquire("pair", None, lambda text: None)
