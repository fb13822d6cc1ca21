"""A target split across two local processes (mlx's ring backend over TCP), with a draft
model on rank 0 only, writes what the same target writes in one process (greedy).

Tiny random-weight Qwen2 models (tests/runtimes/tiny_mlx_pair.py) keep it to seconds: the split
is mlx-lm's own (``model.pipeline``, ``shard``), so random weights exercise it as well
as real ones. The ranks run this file as a script (``python -m``); with
``draftpen serve`` under ``mlx.launch``: tests/runtimes/test_mlx_split_serve.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.runtimes.tiny_mlx_pair import tiny_qwen2_pair

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parents[2]
PROMPT = (
    "The ring backend passes activations between the ranks over TCP, and rank 0 tells "
    "the other rank which tokens to evaluate before every forward pass it makes."
)
MAX_TOKENS = 24
# One thread per rank: the machine may be busy, and the ranks must not fight for it.
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _generate(target: Any, draft: Any) -> dict[str, Any]:
    """Greedy tokens and draft statistics of one generation with the model drafter."""
    from backends.engine import Engine, GenerationRequest
    from backends.sampling.filters import SamplingParams

    engine = Engine(target, draft)
    request = GenerationRequest(
        tuple(engine.text_prompt(PROMPT)),
        params=SamplingParams(temperature=0.0),
        max_tokens=MAX_TOKENS,
        drafter="model",
        draft_tokens=4,
    )
    tokens: list[int] = []
    drafted = accepted = 0
    for event in engine.generate(request):
        tokens.extend(event.tokens)
        drafted, accepted = event.stats.drafted, event.stats.accepted
    return {"tokens": tokens, "drafted": drafted, "accepted": accepted}


def _rank_main(target_path: str, draft_path: str, split: str) -> None:
    """One rank: rank 0 generates through BroadcastTarget and prints JSON; others follow."""
    import mlx.core as mx

    from backends.mlx.distributed import BroadcastTarget, SplitMlxModel, follow
    from backends.mlx.model import MlxModel

    group = mx.distributed.init(strict=True, backend="ring")
    share = SplitMlxModel(target_path, group, split=split, n_ctx=256)  # type: ignore[arg-type]
    if group.rank() != 0:
        follow(share)
        return
    target = BroadcastTarget(share)
    result = _generate(target, MlxModel(draft_path, n_ctx=256))
    target.close()
    print(json.dumps(result), flush=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_split(tmp_path: Path, target: Path, draft: Path, split: str) -> dict[str, Any]:
    """Run two ranks on this machine, as ``mlx.launch --backend ring -n 2`` would."""
    hostfile = tmp_path / f"hosts-{split}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{_free_port()}"] for _ in range(2)]))
    command = [
        sys.executable,
        "-m",
        "tests.runtimes.test_mlx_distributed",
        str(target),
        str(draft),
        split,
    ]
    ranks = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **THREADS, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        outputs = [rank.communicate(timeout=60) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    for rank, (_, errors) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, errors[-3000:]
    return dict(json.loads(outputs[0][0].strip().splitlines()[-1]))


@pytest.mark.parametrize("split", ["pipeline", "tensor"])
def test_a_split_target_with_a_local_draft_writes_what_one_process_writes(
    tmp_path: Path, split: str
):
    pytest.importorskip("mlx_lm")
    from backends.mlx.model import MlxModel

    target, draft = tiny_qwen2_pair(tmp_path)
    alone = _generate(MlxModel(target, n_ctx=256), MlxModel(draft, n_ctx=256))
    split_up = _run_split(tmp_path, target, draft, split)
    assert split_up == alone
    assert len(alone["tokens"]) == MAX_TOKENS
    # Rejected drafts: the followers rolled back with rank 0.
    assert 0 < alone["accepted"] < alone["drafted"], alone


if __name__ == "__main__":
    _rank_main(*sys.argv[1:4])
