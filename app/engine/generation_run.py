"""One generation job, run: its request prepared, the loop's events handed to its
handler, and one log line on how it went.

The queue's worker runs a job this way on the engine itself; with a parallel engine
(``serve --parallel N``) a thread of the job's own runs it on a free slot (see
``backends/engine_slots.py``), while the worker runs the runtime's batched decodes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from app.engine.crash_record import generating
from backends.engine import Engine
from backends.engine_slots import EngineSlots, generate_on_slot
from backends.generation_events import FINISH_CANCELLED, GenerationEvent, SpeculativeStats


class GenerationJob(Protocol):
    """What a generation job is to this module (the queue's ``EngineJob``)."""

    id: str
    pair: str
    prepare: Callable[[Engine], Any] | None
    cancel_event: threading.Event
    cancel_reason: str
    submitted: float
    prompt_tokens: int

    def post(self, item: object) -> None:
        """Hand an item to the job's handler."""
        ...


logger = logging.getLogger("draftpen.server")

# Marks the end of a job's items in its inbox.
END = object()


def run_generation(
    job: GenerationJob,
    engine: Engine,
    started: float,
    slots: EngineSlots | None = None,
    on_slot: Callable[[], None] | None = None,
) -> str:
    """Prepare ``job``'s request against ``engine``, generate (on a slot of ``slots``,
    the one whose cache shares most of the prompt, when given; ``on_slot`` is called
    once it holds it) and post every event; "completed", "cancelled" or "failed"."""
    assert job.prepare is not None
    last: GenerationEvent | None = None
    slot: Engine | None = None
    try:
        # Recorded: a runtime that crashes here is reported with the pair it ran.
        with generating(job.pair):
            prepared = job.prepare(engine)
            request = prepared.request
            job.prompt_tokens = len(request.prompt_tokens)
            job.post(prepared)
            if slots is None:
                events = engine.generate(request, job.cancel_event)
            else:
                slot = slots.take(request.prompt_tokens)
                events = generate_on_slot(slot, request, job.cancel_event, on_slot)
            for event in events:
                job.post(event)
                last = event
    except Exception as error:  # reported to the client; the worker lives on
        logger.warning("%s: failed: %s", job.id, error)
        job.post(error)
        job.post(END)
        return "failed"
    finally:
        if slot is not None and slots is not None:
            slots.give_back(slot)
    job.post(END)
    stats = last.stats if last else SpeculativeStats()
    tokens, seconds = stats.generated_tokens, time.monotonic() - started
    if last is not None and last.finish_reason == FINISH_CANCELLED:
        logger.info(
            "%s: cancelled after %d tokens in %.2fs (%s)",
            job.id,
            tokens,
            seconds,
            job.cancel_reason or "cancelled",
        )
        return "cancelled"
    # The prompt's cached share says whether an agent's turn read only what was new;
    # the drafts, whether speculation helped this reply (as llama.cpp's server logs).
    logger.info(
        "%s: %d tokens in %.2fs after %.2fs in the queue, finish_reason %s; "
        "prompt %d tokens, %d of them cached, read in %.2fs, first token after %.2fs; "
        "%d drafted, %d accepted",
        job.id,
        tokens,
        seconds,
        started - job.submitted,
        last.finish_reason if last else None,
        stats.prompt_tokens,
        stats.cached_prompt_tokens,
        stats.prefill_seconds,
        stats.time_to_first_token,
        stats.drafted,
        stats.accepted,
    )
    return "completed"


def cancelled_event(prompt_tokens: int) -> GenerationEvent:
    """The final event of a job that never ran."""
    return GenerationEvent(
        text="",
        segments=(),
        tokens=(),
        from_draft=(),
        drafter="none",
        draft_length=0,
        stats=SpeculativeStats(prompt_tokens=prompt_tokens),
        finish_reason=FINISH_CANCELLED,
    )
