"""On MLX a pair drafts with a draft model and n-grams only: asking it for an EAGLE-3 or
MTP head is refused with a message that says MLX runs none and what to use instead,
both when a request names the drafter and when a head's file is handed to the engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.engine import Engine
from backends.errors import BackendError
from tests.runtimes.tiny_llama_mlx import _tiny_llama

pytestmark = pytest.mark.real_model


@pytest.fixture
def mlx_engine(tmp_path: Path):
    from backends.mlx.model import MlxModel

    target = MlxModel(_tiny_llama(tmp_path / "tiny", seed=3), n_ctx=128)
    engine = Engine(target, None)
    try:
        yield engine
    finally:
        engine.close()


@pytest.mark.parametrize(("drafter", "head"), [("eagle3", "an EAGLE-3 head"), ("mtp", "MTP head")])
def test_an_mlx_engine_refuses_a_head_drafter_saying_mlx_runs_none(
    mlx_engine: Engine, drafter: str, head: str
) -> None:
    with pytest.raises(BackendError) as caught:
        mlx_engine.drafter_named(drafter)
    message = str(caught.value)
    assert head in message and "MLX cannot yet" in message
    assert "--drafter ngram, model or none" in message


def test_an_eagle3_heads_file_is_refused_on_mlx_before_anything_reads_it(
    mlx_engine: Engine, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-eagle3.gguf"  # never opened: refused for the runtime
    with pytest.raises(BackendError, match="cannot draft with an EAGLE-3 head"):
        mlx_engine.attach_eagle3_head(missing)
