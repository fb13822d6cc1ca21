"""Several generations at once on one loaded pair: one slot per sequence.

An :class:`~backends.engine.Engine` whose target was loaded with ``parallel`` N > 1
(``draftpen serve --parallel N``) gets N slots: each slot is an engine of its own (a
:meth:`~backends.engine.Engine.sibling`) over one sequence of the target's context and
one of the draft's, so each generation keeps its own loop, drafter state, grammar,
penalties and statistics, while the sequences' forwards are batched by the runtime
(``backends/llamacpp/decode_batcher.py``; ``backends/mlx/forward_batcher.py``). A
generation takes the free slot whose cache shares the most with its prompt, so a
conversation that comes back finds its state where it left it.

A pair that cannot hold several sequences (a recurrent target, an MTP head) has one
slot: it generates in turn, and ``refusal`` says why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from backends.engine import Engine, GenerationRequest
from backends.generation_events import GenerationEvent
from backends.runtime_exchange import RuntimeExchange
from backends.token_prefix import common_prefix_length


def parallel_of(engine: Engine, asked: int | None = None) -> tuple[int, str | None]:
    """How many sequences ``engine``'s models were loaded for, and why fewer than
    ``asked`` (None: as asked, or nothing was asked)."""
    target, draft = engine.target, engine.draft
    if not hasattr(target, "parallel"):
        wanted = asked is not None and asked > 1
        return 1, "this runtime generates one sequence at a time" if wanted else None
    count = int(target.parallel)
    refusal = getattr(target, "parallel_refusal", None)
    if draft is not None and int(getattr(draft, "parallel", 1)) != count:
        return 1, refusal or "the draft model holds one sequence"
    return count, refusal


def slots_for(
    engine: Engine, current: EngineSlots | None, exchange: RuntimeExchange
) -> EngineSlots | None:
    """``engine``'s slots: ``current`` when they are its, else made now (and closed
    with it); None for an engine of one sequence, which generates by itself."""
    if parallel_of(engine)[0] < 2:
        return None
    if current is not None and current.engine is engine:
        return current
    slots = EngineSlots(engine, exchange)
    engine.on_close(slots.close)
    return slots


class EngineSlots:
    """The slots of a parallel engine; generations take and give them back."""

    def __init__(self, engine: Engine, exchange: RuntimeExchange) -> None:
        self.engine = engine
        self.count, self.refusal = parallel_of(engine)
        if self.count < 2:
            raise ValueError("one sequence: generate on the engine itself")
        self._target_views = _sequence_views(engine.target, exchange)
        self._draft_views = (
            _sequence_views(engine.draft, exchange) if engine.draft is not None else None
        )
        target = engine.target
        if getattr(target, "exact_kernels", False) or getattr(target, "exact_output", False):
            # Rows round like one-token decoding only in batches up to the measured
            # size: the sequences' rounds gather up to it (the draft's need not).
            costs = engine.costs
            limit = costs.exact_batch_limit if costs is not None else None
            self._target_views.batcher.exact_limit = max(1, limit or 1)
        drafts = self._draft_views.views if self._draft_views else [None] * self.count
        self._free: list[Engine] = [
            engine.sibling(target, draft)
            for target, draft in zip(self._target_views.views, drafts, strict=True)
        ]
        for slot in self._free:
            slot.sharing = self._target_views.batcher.generating_count
        self._lock = threading.Lock()
        self._uses = 0
        self._last_use: dict[int, int] = {}

    def take(self, prompt: Sequence[int]) -> Engine:
        """The free slot whose target shares the longest prefix with ``prompt`` (of
        those alike, the one least recently used: its cache is the least likely to be
        wanted back).

        Raises LookupError when every slot is taken (the queue never asks then)."""
        with self._lock:
            if not self._free:
                raise LookupError("every slot is generating")

            def rank(slot: Engine) -> tuple[int, int]:
                shared = common_prefix_length(list(slot.target.cached_tokens), prompt)
                return shared, -self._last_use.get(id(slot), -1)

            best = max(self._free, key=rank)
            self._free.remove(best)
            self._uses += 1
            self._last_use[id(best)] = self._uses
            return best

    def give_back(self, slot: Engine) -> None:
        """Free ``slot`` for the next generation."""
        with self._lock:
            self._free.append(slot)

    def close(self) -> None:
        """Stop batching for both contexts (before the engine frees its models)."""
        self._target_views.close()
        if self._draft_views is not None:
            self._draft_views.close()


def _sequence_views(model: object, exchange: RuntimeExchange) -> Any:
    """The views of ``model``'s sequences, by its runtime's own room (imported here
    only: a runtime is imported where it is used)."""
    if type(model).__module__.startswith("backends.mlx."):
        from backends.mlx.sequences import sequence_views as mlx_views

        return mlx_views(model, exchange)  # type: ignore[arg-type]
    from backends.llamacpp.sequences import sequence_views

    return sequence_views(model, exchange)  # type: ignore[arg-type]


def generate_on_slot(
    slot: Engine,
    request: GenerationRequest,
    cancel: threading.Event | None = None,
    generating: Callable[[], None] | None = None,
) -> Iterator[GenerationEvent]:
    """``slot.generate``, with its sequences marked as generating meanwhile: the
    batcher waits for a generating sequence's decode before it runs the others'
    (``generating``: called once they are marked)."""
    views = [slot.target]
    if slot.draft is not None and slot._draft_in_use(request) is not None:
        views.append(slot.draft)
    for view in views:
        view.generating(True)  # type: ignore[attr-defined]
    if generating is not None:
        generating()
    try:
        yield from slot.generate(request, cancel)
    finally:
        for view in views:
            view.generating(False)  # type: ignore[attr-defined]
