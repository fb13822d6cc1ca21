"""Which pair to run on this machine, and why: the mark in ``models list`` and the models screen.

The rule, stated so a person can check it:

- With a GPU, the pair with the largest target whose target, draft and both KV caches
  (at the default context) fit in GPU memory: on a GPU decoding is memory-bound, a
  verify of a few tokens costs about one decode, and the draft model pays.
- Without one (or when nothing fits the GPU), decoding on the CPU is compute-bound and
  slows with the target's size, so the largest target that fits RAM *and* is estimated
  to decode at :data:`MIN_CPU_TOKENS_PER_SECOND` or more on this machine's cores. The
  estimate is anchored on a measurement: the starter pair's 1.1 GB target decodes at
  ~11 tok/s on 2 cores of our CI machine (README, "Performance on this machine").

Between pairs with the same target, one with a drafter wins (it can speculate with a
draft model, or with the target's own MTP head, as well as n-grams): on a 24 GB GPU that
is Qwen3.6-27B Q4 drafting with its MTP head, the largest target that fits. It is
advice, not a limit: every pair stays usable.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from app.models.catalog import HEAD_DRAFTERS, HEAD_NAMES
from app.models.disk import format_bytes
from app.models.fit import MachineMemory
from app.models.overview import PairRow, VariantRow

# Measured: 1,117,320,768-byte target at ~11.2 tok/s on 2 cores -> bytes x tok/s per core.
CPU_BYTES_TOKENS_PER_CORE = 1_117_320_768 * 11.2 / 2
MIN_CPU_TOKENS_PER_SECOND = 8.0
"""A comfortable chat pace; much slower and a reply feels stuck."""


@dataclass(frozen=True)
class Recommendation:
    """The pair to run here, on which runtime, and the reason in a sentence."""

    pair: str
    runtime: str
    reason: str


def estimated_cpu_tokens_per_second(target_bytes: int, cores: int) -> float:
    """A rough CPU decode rate for a target of this size (see the module docstring)."""
    return CPU_BYTES_TOKENS_PER_CORE * cores / max(target_bytes, 1)


def recommend_pair(
    rows: Sequence[PairRow], machine: MachineMemory, runtime: str
) -> Recommendation | None:
    """The best pair for this machine's ``runtime``; None when no pair fits at all."""
    fitting = [
        (pair, variant)
        for pair in rows
        if pair.recommend and (variant := pair.variant(runtime)) is not None and variant.fit.fits
    ]
    if not fitting:
        return None
    on_gpu = [(pair, variant) for pair, variant in fitting if variant.fit.place == "gpu"]
    if on_gpu:
        pair, variant = max(on_gpu, key=lambda item: _rank(item[1]))
        memory = "unified memory" if machine.unified else "VRAM"
        return Recommendation(
            pair.name,
            runtime,
            f"the largest target that fits the GPU with {_with_what(variant)} and both KV "
            f"caches at {variant.fit.n_ctx} tokens ({format_bytes(variant.fit.needed_bytes)} "
            f"of {format_bytes(machine.vram_bytes or 0)} {memory})",
        )
    cores = machine.cpu_cores or os.cpu_count() or 1
    quick = [
        (pair, variant)
        for pair, variant in fitting
        if estimated_cpu_tokens_per_second(_target_bytes(variant), cores)
        >= MIN_CPU_TOKENS_PER_SECOND
    ]
    if quick:
        pair, variant = max(quick, key=lambda item: _rank(item[1]))
        rate = estimated_cpu_tokens_per_second(_target_bytes(variant), cores)
        why = (
            f"runs on the CPU here: the largest target that fits RAM and is estimated to "
            f"decode at {MIN_CPU_TOKENS_PER_SECOND:.0f} tok/s or more on {cores} cores "
            f"(~{rate:.0f} tok/s); larger pairs fit but would decode slower"
        )
    else:
        pair, variant = min(fitting, key=lambda item: _target_bytes(item[1]))
        rate = estimated_cpu_tokens_per_second(_target_bytes(variant), cores)
        why = (
            f"runs on the CPU here: the smallest target that fits RAM (~{rate:.1f} tok/s "
            f"estimated on {cores} cores; every pair is slow on this machine)"
        )
    return Recommendation(pair.name, runtime, why)


def _target_bytes(variant: VariantRow) -> int:
    return variant.models[0].size_bytes


def _rank(variant: VariantRow) -> tuple[int, bool]:
    # A draft model and an MTP head both count: either drafts better than n-grams alone.
    pair = variant.variant
    return _target_bytes(variant), pair.draft is not None or pair.uses_mtp


def _with_what(variant: VariantRow) -> str:
    pair = variant.variant
    if pair.uses_mtp:
        # An MTP head inside the target costs no memory of its own; a separate one does.
        return "its MTP head file" if pair.mtp_head is not None else "its own MTP head"
    if pair.drafter in HEAD_DRAFTERS:
        return f"its {HEAD_NAMES[str(pair.drafter)].split(' ', 1)[1]}"  # "its EAGLE-3 head"
    return "its draft model" if pair.draft is not None else "no draft model"
