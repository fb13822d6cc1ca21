"""Generations at once on a parallel engine's slots, as the engine's server runs them:
a runtime thread serving the exchange, and each request on a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.engine_slots import EngineSlots, generate_on_slot
from backends.runtime_exchange import RuntimeExchange
from backends.sampling.filters import SamplingParams


@contextmanager
def serving_exchange() -> Iterator[RuntimeExchange]:
    """A runtime exchange with a thread serving it until the block ends."""
    exchange = RuntimeExchange()
    stop = threading.Event()
    runtime = threading.Thread(target=exchange.serve, args=(stop,), daemon=True)
    runtime.start()
    try:
        yield exchange
    finally:
        exchange.stop_serving(stop)
        runtime.join(timeout=10)


def run_on_slots(
    slots: EngineSlots, requests: Mapping[Hashable, GenerationRequest], timeout: float = 300
) -> dict[Hashable, tuple[Engine, list[Any]]]:
    """Every request on a slot of its own (the one sharing most of its prompt), all
    generated at once: each one's slot and events. Raises the first error any raised."""
    done: dict[Hashable, tuple[Engine, list[Any]]] = {}
    errors: list[BaseException] = []
    taken = {key: slots.take(request.prompt_tokens) for key, request in requests.items()}

    def run(key: Hashable) -> None:
        slot = taken[key]
        try:
            done[key] = (slot, list(generate_on_slot(slot, requests[key])))
        except BaseException as error:  # re-raised below, on the test's thread
            errors.append(error)
        finally:
            slots.give_back(slot)

    threads = [threading.Thread(target=run, args=(key,)) for key in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    if errors:
        raise errors[0]
    return done


def reply_tokens(events: list[Any]) -> list[int]:
    """The tokens of a reply's events, in order."""
    return [token for event in events for token in event.tokens]


def greedy_chat_request(
    engine: Engine, text: str, drafter: str, *, max_tokens: int, draft_tokens: int
) -> GenerationRequest:
    """A greedy, ``--exact`` reply to the user message ``text``, drafted by ``drafter``."""
    return GenerationRequest(
        tuple(engine.chat_prompt([ChatMessage("user", text)])),
        params=SamplingParams(temperature=0.0),
        max_tokens=max_tokens,
        drafter=drafter,
        draft_tokens=draft_tokens,
        exact=True,
    )


def record_shared_decodes(slots: EngineSlots) -> list[int]:
    """From now on, how many sequences each of the slots' target decodes carries (a
    llama.cpp context's batcher), appended to the list returned."""
    batcher = slots._target_views.batcher
    shared: list[int] = []
    decode = batcher._decode

    def recording(group: list) -> None:
        shared.append(len({request.seq for request in group}))
        decode(group)

    batcher._decode = recording  # type: ignore[method-assign]
    return shared


def head_rows(
    engine: Engine, drafter: str, context: list[int], between: Engine | None = None
) -> list[np.ndarray]:
    """The first draft's row of ``engine``'s head after the target's cache, with
    ``context``'s last token pending (a chain head's start, a block's first slot); for a
    chain head (EAGLE-3, MTP), also the next row of its chain, after ``between``'s head
    (a sequence of the same context), if given, drafted in the meantime."""
    head = engine.drafter_named(drafter).head  # type: ignore[attr-defined]
    evaluated = len(engine.target.cached_tokens)
    try:
        if drafter not in ("eagle3", "mtp"):
            rows = head.draft_block(evaluated, context, 1)
            assert rows is not None
            return [np.array(rows.row(0), dtype=np.float32)]
        first = head.start(evaluated, context)
        assert first is not None
        first = np.array(first.row(0), dtype=np.float32)
        if between is not None:
            head_rows(between, drafter, [*between.target.cached_tokens, int(first.argmax())])
        second = np.array(head.step(int(np.argmax(first))).row(0), dtype=np.float32)
        return [first, second]
    finally:
        head.finish()
