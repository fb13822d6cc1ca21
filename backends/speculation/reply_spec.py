"""What the loop is asked for, as two values: the reply (:class:`ReplySpec`) and how the
caller reaches into the loop while it runs (:class:`LoopHooks`).

``speculative_generate`` (``loop.py``) takes the target, the prompt, the draft policy and
these two, so its signature reads at once; the engine builds them from a request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.base import SavePoint
from backends.output.constraints import GrammarState
from backends.output.repeated_calls import RepeatedCallStop
from backends.sampling.filters import SamplingParams


@dataclass(frozen=True)
class ReplySpec:
    """One reply: how its tokens are sampled (``params``), at most how many
    (``max_tokens``), where its text ends (``stop`` strings, never shown; with
    ``repeated_calls``, where a tool call identical to an earlier one begins), what it
    must look like (``constraint``: a grammar state at the start of the output, which
    the loop advances: one per reply) and whether each token carries the target's
    log-probabilities (``logprobs``: None off, N in 0..20 alternatives).
    """

    params: SamplingParams
    max_tokens: int
    stop: Sequence[str] = ()
    constraint: GrammarState | None = None
    logprobs: int | None = None
    repeated_calls: RepeatedCallStop | None = None


@dataclass(frozen=True)
class LoopHooks:
    """The caller's ways into a running loop: ``cancel`` (checked between rounds and
    between slices of the prompt), ``prepare_cache`` (run on the prompt before it is
    read: it may bring back a kept or saved state, and return a :class:`SavePoint` where
    the reading pauses while the state is kept) and ``overlap_drafting`` (draft the next
    round during each verify, for a target split over workers: ``overlap.py``).
    """

    cancel: threading.Event | None = None
    prepare_cache: Callable[[Sequence[int]], SavePoint | None] | None = None
    overlap_drafting: bool = False


NO_HOOKS = LoopHooks()
