"""Measuring what a forward pass costs on this machine, for this pair.

The numbers decide whether speculation can pay: the time of a target forward of n
tokens for n up to 8 (and 16), and of one draft-model step. Every size up to 8 is
measured because the cost curve is not smooth: llama.cpp switches kernels at
batch-size thresholds, so a batch of 4 can cost less than a batch of 3.

The same pass checks exactness: the logits of each batch are compared, bit for bit,
with the logits of the same tokens decoded one at a time. Kernels for larger batches
may add up in another order and round differently (measured on our CPU: up to 0.5 in
a logit from 8 tokens on, from 4 with repacked weights), and a verify batch that
rounds differently can flip a near-tie, so greedy output would no longer equal plain
decoding. ``exact_batch_limit`` is the largest batch whose every row matched.

Kernels also switch on the context length: llama.cpp's CPU attention splits a
one-token decode across threads once the cache view reaches 512 cells, while a batch
keeps the one-pass kernel (measured: from there even a batch of 2 differed by 0.45 in
a logit with the default F16 V cache; backends/llamacpp/model.py avoids it). So the target
is measured past 512 tokens of context, where both kinds of switch show, and where a
chat with some history really decodes. Batch-size switches do not depend on the
position, so one position is enough.

It takes about 20 seconds on a 2-core CPU with a 1.5B target, most of it filling
that context (a fraction of a second on a GPU); callers cache the result (see
app/calibration_store.py).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence

import numpy as np
import psutil

from backends.base import Model
from backends.errors import ContextOverflowError
from backends.speculation.cost_model import CostModel

CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16)
EXACTNESS_CHECKED_UP_TO = 8  # larger verify batches are never trusted to be exact
DRAFT_STEP_SAMPLES = 4
# The target is measured this far into the context: past 512 cache cells, where
# llama.cpp's CPU attention changes how it decodes a single token.
MEASURED_POSITION = 520
DRAFT_POSITION = 64  # a draft step barely depends on the position; keep it cheap
# A forward of n tokens never costs much more than n forwards of one (a batch reads the
# weights once), nor much less than a smaller batch (kernels switch at thresholds: a
# batch of 4 may cost less than one of 3, not half). Figures outside these were taken
# while the machine was busy: seen, T(4) = 1.1 s and T(16) = 0.95 s against T(1) =
# 0.036 s, measured during a compile, which made `auto` draft where it loses, and
# stayed cached for the machine.
DISTURBED_OVER_SEQUENTIAL = 2.0
DISTURBED_UNDER_SMALLER = 0.5
# A one-token forward dearer than one of 2 or 3 tokens is a busy moment, not a kernel:
# seen, T(1) = 295 ms beside T(3) = 283 ms (a quiet T(1) is 45 ms), taken during a
# compile; it passed both rules above, and `auto` then drafted at 0.69x of plain for good.
# The margin covers a GPU, where T(2) is T(1) within its noise.
DISTURBED_ONE_OVER_FEW = 1.02
# The one-token cost is the median of several forwards; the fastest one-token forward
# seen (right after the prompt's reading, among those, or timed again after the batches)
# this much under it means the machine's load changed while measuring: noise only ever
# slows a forward down.
DISTURBED_OVER_FASTEST = 1.5
# Other processes using this share of the machine's CPUs while measuring: a busy machine
# (a compile on 2 cores reads ~1.0; a browser on 16 cores ~0.05).
DISTURBED_OTHERS_CPU_SHARE = 0.25
ONE_TOKEN_AGAIN_SAMPLES = 4  # one-token forwards timed again after the batches
# Ordinary text, so the forwards run with varied tokens.
_CONTEXT_TEXT = (
    "measure the cost of a forward pass at a realistic position in the context. "
    "the quick brown fox jumps over the lazy dog, then writes a short function "
    "that returns the sum of a list of numbers, and explains each line in plain words. "
)


def disturbed(costs: CostModel) -> str | None:
    """Why ``costs`` look measured on a busy machine, in words; None if they look sound."""
    seconds = costs.target_seconds
    one = seconds[1]
    sizes = sorted(seconds)
    if costs.others_cpu_share is not None and costs.others_cpu_share > DISTURBED_OTHERS_CPU_SHARE:
        return f"other processes used {costs.others_cpu_share:.0%} of the CPUs while measuring"
    for size in (2, 3):
        if size in seconds and one > DISTURBED_ONE_OVER_FEW * seconds[size]:
            return (
                f"a one-token forward took {one * 1000:.0f} ms, more than one of {size} "
                f"tokens ({seconds[size] * 1000:.0f} ms)"
            )
    fastest = costs.one_token_fastest
    if fastest is not None and one > DISTURBED_OVER_FASTEST * fastest:
        return (
            f"one-token forwards took {one * 1000:.0f} ms, but {fastest * 1000:.0f} ms at "
            "best: the machine's load changed while measuring"
        )
    for size in sizes:
        if seconds[size] > DISTURBED_OVER_SEQUENTIAL * size * one:
            return (
                f"a forward of {size} tokens took {seconds[size] * 1000:.0f} ms, more than "
                f"{DISTURBED_OVER_SEQUENTIAL:g}x {size} forwards of one ({one * 1000:.0f} ms each)"
            )
    for index, size in enumerate(sizes[1:], start=1):
        dearest = max(sizes[:index], key=lambda smaller: seconds[smaller])
        if seconds[size] < DISTURBED_UNDER_SMALLER * seconds[dearest]:
            return (
                f"a forward of {size} tokens took {seconds[size] * 1000:.0f} ms, under half "
                f"of one of {dearest} ({seconds[dearest] * 1000:.0f} ms)"
            )
    return None


def time_forward(model: Model, tokens: Sequence[int]) -> tuple[float, np.ndarray]:
    """Seconds for one forward of ``tokens`` and a copy of its logits; then roll back."""
    base = len(model.cached_tokens)
    started = time.perf_counter()
    rows = model.forward(tokens)
    seconds = time.perf_counter() - started
    copied = np.array(rows, copy=True)
    model.rollback(base)
    return seconds, copied


def measure_costs(
    target: Model,
    draft: Model | None = None,
    *,
    sizes: Sequence[int] = CALIBRATION_SIZES,
    repeats: int = 3,
) -> CostModel:
    """Time target forwards of ``sizes`` tokens and a draft step; check batch exactness.

    Both models' caches are left empty.
    """
    longest = max(max(sizes), EXACTNESS_CHECKED_UP_TO)
    # A model whose context cannot reach the usual position is measured as deep as it goes.
    position = min(MEASURED_POSITION, target.n_ctx - longest - 1)
    if position < DRAFT_POSITION:
        raise ContextOverflowError(
            f"A {target.n_ctx}-token context is too short to calibrate the auto drafter "
            f"(it needs {DRAFT_POSITION + longest + 1}). Raise the context length, or "
            "choose the model, n-gram or no drafter."
        )
    sentence = target.tokenize(_CONTEXT_TEXT, add_special=False)
    context = (sentence * (-(-(position + longest) // len(sentence))))[: position + longest]
    prefix, probe = context[:position], context[position:]

    busy_before, own_before, wall_before = _cpu_seconds(), _own_cpu_seconds(), time.monotonic()
    target.rollback(0)
    target.prefill(prefix)
    # Warm-up, and the first one-token forward after reading a prompt.
    after_reading, _ = time_forward(target, probe[:1])
    # One token at a time: the plain-decoding cost, and the reference logits.
    single_seconds, single_rows = [], []
    base = len(target.cached_tokens)
    for token in probe[:EXACTNESS_CHECKED_UP_TO]:
        started = time.perf_counter()
        row = target.forward([token])
        single_seconds.append(time.perf_counter() - started)
        single_rows.append(np.array(row[0], copy=True))
    target.rollback(base)

    target_seconds = {1: statistics.median(single_seconds)}
    exact = {1: True}
    for size in sorted(s for s in sizes if s > 1):
        # The first forward of a new batch size pays one-time costs (on a GPU, kernel
        # selection and buffers for the new shape: measured on an H100, a 2-token
        # forward took 2.2x a one-token one the first time), which decoding never sees.
        time_forward(target, probe[:size])
        samples = []
        for repeat in range(max(1, repeats)):
            seconds, rows = time_forward(target, probe[:size])
            samples.append(seconds)
            if repeat == 0 and size <= EXACTNESS_CHECKED_UP_TO:
                exact[size] = all(
                    np.array_equal(rows[index], single_rows[index]) for index in range(size)
                )
        target_seconds[size] = statistics.median(samples)
    # The one-token cost once more: a load that went meanwhile shows as a faster one.
    one_token_fastest = min(
        after_reading,
        *single_seconds,
        *(time_forward(target, probe[i : i + 1])[0] for i in range(ONE_TOKEN_AGAIN_SAMPLES)),
    )
    target.rollback(0)

    exact_limit = 1
    while exact.get(exact_limit + 1, False):
        exact_limit += 1

    draft_seconds: float | None = None
    if draft is not None:
        draft.rollback(0)
        draft.prefill(context[:DRAFT_POSITION])
        time_forward(draft, probe[:1])  # warm up
        draft_seconds = statistics.median(
            time_forward(draft, probe[index : index + 1])[0] for index in range(DRAFT_STEP_SAMPLES)
        )
        draft.rollback(0)
    wall = time.monotonic() - wall_before
    others = (_cpu_seconds() - busy_before) - (_own_cpu_seconds() - own_before)
    return CostModel(
        target_seconds,
        draft_seconds,
        exact_batch_limit=exact_limit,
        taken_at=time.time(),
        others_cpu_share=max(0.0, others / (wall * (os.cpu_count() or 1))) if wall > 0 else 0.0,
        one_token_fastest=one_token_fastest,
    )


def _cpu_seconds() -> float:
    """CPU seconds every process on this machine has used (busy, not idle or waiting)."""
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _own_cpu_seconds() -> float:
    """CPU seconds this process (the runtime's threads included) has used."""
    times = psutil.Process().cpu_times()
    return times.user + times.system
