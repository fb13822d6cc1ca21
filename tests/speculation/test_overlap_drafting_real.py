"""Drafting during the remote verify with real workers (backends/speculation/overlap.py).

Two real ``draftpen worker`` processes on 127.0.0.1 hold SmolLM2's layers; the same
file, loaded on this machine, is the draft model. The generations run in a child
process (workers registered with ggml stay registered for the process's life), which
prints what the test checks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.runtimes.real_workers import (
    Worker,
    home,  # noqa: F401  (fixtures)
    two_workers,  # noqa: F401  (fixtures)
)
from tests.support.draftpen_cli import REPO
from tests.support.model_files import SMOLLM2_KEY, require_model

pytestmark = pytest.mark.real_model

CHILD = textwrap.dedent(
    """
    import json, os, sys
    from backends.engine import Engine, GenerationRequest
    from backends.llamacpp.model import LlamaCppModel
    from backends.workers.cluster import Workers

    path, addresses = sys.argv[1], sys.argv[2]
    chosen = Workers.parse(addresses, "0,1,1")
    target = LlamaCppModel(path, n_ctx=1024, workers=chosen.ask(), worker_split=chosen.weights)
    engine = Engine(target, LlamaCppModel(path, n_ctx=1024))
    prompt = tuple(engine.text_prompt(
        "<|im_start|>user\\nCount from one to twenty in words.<|im_end|>\\n"
        "<|im_start|>assistant\\n"))

    def run(drafter, overlap):
        request = GenerationRequest(prompt, max_tokens=40, drafter=drafter, draft_tokens=2,
                                    overlap_drafting=overlap)
        tokens, stats = [], None
        for event in engine.generate(request):
            tokens.extend(event.tokens)
            stats = event.stats
        return tokens, stats

    serial, serial_stats = run("model", False)
    threads_before = len(os.listdir("/proc/self/task"))
    overlapped, stats = run("model", True)
    threads_after = len(os.listdir("/proc/self/task"))
    print(json.dumps({
        "overlaps": engine.overlaps(),
        "serial": serial, "overlapped": overlapped,
        "serial_predrafted": serial_stats.predrafted_rounds,
        "predrafted": stats.predrafted_rounds, "used": stats.predrafts_used,
        "new_threads": threads_after - threads_before,
    }))
    """
)


def test_a_split_target_writes_the_same_tokens_with_the_overlap_on_and_off(
    two_workers: tuple[Worker, Worker],  # noqa: F811
) -> None:
    path = require_model(SMOLLM2_KEY)
    addresses = ",".join(worker.address for worker in two_workers)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), addresses],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert seen["overlaps"]
    assert seen["overlapped"] == seen["serial"]
    assert seen["serial_predrafted"] == 0
    # The draft model is the target's own file: nearly every guess holds.
    assert seen["predrafted"] > 0 and seen["used"] > 0
    # The verify's helper thread is the one new thread: its forward led no OpenMP team
    # of its own (which would have added the team's threads too).
    assert seen["new_threads"] <= 1
