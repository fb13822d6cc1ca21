"""``draftpen serve --runtime mlx --parallel 2`` end to end (issue 37, part 5).

A real ``draftpen serve`` subprocess on the MLX runtime (Linux's MLX CPU here), asked
over its Unix socket by the official ``openai`` SDK from two clients at once. The pair
is a tiny random-weight llama target with a perturbed copy as its draft
(tests/runtimes/tiny_llama_mlx.py's models), listed in a catalog of the test's own
(``$DRAFTPEN_CATALOG``) and stored as a converted MLX model, so that loading and
measuring forward costs take seconds: SmolLM2 on MLX's CPU takes over a minute to
calibrate and reads ~10 prompt tokens a second.

Exact output (``exact_output = true``): the promise that a reply beside others is the
reply alone holds under it only. There the forward batcher gathers rounds only where the
probe measured that the loaded model's rows round as alone (MLX's CPU: bit for bit) and
up to the calibration's exact batch limit; anything else runs by itself, the very call
the model makes alone. Under fast output a gathered row may round a near-tie the other way.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.runtimes.tiny_llama_mlx import _tiny_llama
from tests.runtimes.tiny_mlx_pair import mlx_pair_catalog, store_converted
from tests.support.model_files import SMOLLM2_KEY, require_mlx_model
from tests.support.serve_process import RunningServer, start_server

pytest.importorskip("mlx_lm")

pytestmark = pytest.mark.real_model

PAIR = "tiny-mlx-pair"
TARGET = "tiny-mlx-target"
DRAFT = "tiny-mlx-draft"
CATALOG = mlx_pair_catalog(PAIR, TARGET, DRAFT, "llama")
# Each prompt differs from the other's from its first word on.
PROMPTS = ("Apples: write one short sentence.", "Bridges: write one short sentence.")
MAX_TOKENS = 48


def _built_models(directory: Path) -> tuple[Path, Path]:
    """The tiny pair's MLX directories, written under ``directory`` (before the test's
    catalog replaces the one that names SmolLM2, whose tokenizer they copy)."""
    directory.mkdir()
    target = _tiny_llama(directory / TARGET, seed=1)
    draft = _tiny_llama(directory / DRAFT, seed=2, like=target)
    facts = require_mlx_model(SMOLLM2_KEY) / "draftpen-mlx.json"
    for model in (target, draft):
        # SmolLM2's tokenizer facts (end-of-generation ids), as a conversion records them.
        shutil.copy(facts, model / facts.name)
    return target, draft


@pytest.fixture(scope="module")
def mlx_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The engine, started with the tiny MLX pair loaded and two sequences."""
    home = tmp_path_factory.mktemp("mlx-parallel-home")
    (home / "config").mkdir()
    (home / "config" / "settings.toml").write_text("exact_output = true\n")
    catalog = home / "models.toml"
    catalog.write_text(CATALOG)
    built = _built_models(home / "built")
    with pytest.MonkeyPatch.context() as patch:
        # Read by this process (the store's paths) and by the server it starts.
        patch.setenv("DRAFTPEN_CATALOG", str(catalog))
        patch.setenv("DRAFTPEN_MODELS_DIR", str(home / "models"))
        store_converted(home / "models", dict(zip((TARGET, DRAFT), built, strict=True)))
        running = start_server(
            home, home / "mlx.sock", "--runtime", "mlx", "--parallel", "2", pair=PAIR
        )
        try:
            yield running
        finally:
            running.stop()


def _request(messages: list[dict[str, str]], **fields: Any) -> dict[str, Any]:
    """A greedy chat request of ``messages`` to the tiny pair."""
    return {
        "model": PAIR,
        "messages": messages,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        **fields,
    }


def _ask(server: RunningServer, request: dict[str, Any]) -> tuple[str, int, int]:
    """The reply's text, its prompt's length, and how many of those tokens came from a
    cache."""
    response = server.openai().chat.completions.create(**request)
    usage = response.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return response.choices[0].message.content or "", usage.prompt_tokens, cached


def test_health_says_the_mlx_engine_runs_two_sequences(mlx_server: RunningServer) -> None:
    health = mlx_server.health()
    (loaded,) = health["loaded"]
    assert loaded["pair"] == PAIR and loaded["exact"] is True
    assert loaded["target"] == TARGET and loaded["draft"] == DRAFT
    assert health["queue"]["parallel"] == 2 and health["queue"]["parallel_refusal"] is None


def test_concurrent_replies_equal_their_replies_alone(mlx_server: RunningServer) -> None:
    # One reply drafts with the draft model (K=3: verify rounds of 4 rows, and the draft's
    # own rounds), the other as the engine decides: rounds of different widths gather
    # into one padded [B, L] forward.
    drafters = ({"speculative": {"drafter": "model", "k": 3}}, {})
    requests = [
        _request([{"role": "user", "content": prompt}], extra_body=extra)
        for prompt, extra in zip(PROMPTS, drafters, strict=True)
    ]
    most_at_once = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal most_at_once
        while not done.is_set():
            most_at_once = max(most_at_once, mlx_server.health()["queue"]["running_count"])
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            together = list(pool.map(lambda request: _ask(mlx_server, request)[0], requests))
    finally:
        done.set()
        watcher.join()
    alone = [_ask(mlx_server, request)[0] for request in requests]
    assert together == alone
    assert all(alone) and alone[0] != alone[1]
    assert most_at_once == 2  # the two replies were written at once


def test_a_conversation_sent_again_reads_its_prefix_from_the_cache(
    mlx_server: RunningServer,
) -> None:
    first = [{"role": "user", "content": "Cats: write one short sentence."}]
    reply, first_length, _ = _ask(mlx_server, _request(first))
    # The next turn resends the whole transcript, as a chat client does. The slot whose
    # cache shares the longest prefix is taken: it holds the first turn's prompt and reply
    # (all but the reply's tail, which the transcript may tokenize otherwise).
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "More."}]
    again, length, cached = _ask(mlx_server, _request(second))
    assert again
    assert first_length - 1 <= cached < length
    # Sent once more, the same request reads all but its last prompt token from the cache
    # (the loop evaluates that one itself) and writes the same greedy reply.
    repeated, _, cached_again = _ask(mlx_server, _request(second))
    assert repeated == again and cached_again == length - 1
    assert mlx_server.health()["queue"]["failed"] == 0
