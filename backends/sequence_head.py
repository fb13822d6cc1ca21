"""One sequence's draft head in a parallel target: the loaded head's weights, shared,
with a state of the sequence's own, worked on the runtime thread. Both runtimes' views
(``backends/llamacpp/sequences.py``, ``backends/mlx/sequences.py``) draft through it.

A parallel target's sequences each follow their own cache, so each drafts with a head
state of its own (the runtime head's ``for_sequence``: its cache entries, its kept
target rows, its counters). The rows it reads are its sequence's own: the runtime's
batcher hands every sequence its rows of each batched forward (``target_decoded``).

A head computes on the runtime (MLX must not be evaluated from two threads at once; a
llama.cpp head's context reads the target's and is shared by the sequences' heads), and
a view's generation runs on a thread of its own. So :class:`SequenceHead` hands every
call that computes (``start``, ``step``, ``draft_block``) to the runtime thread and
returns host rows; what only follows the target (a rollback, a restored cache, a
round's end) is noted on the calling thread and done on the runtime thread before the
head's next work there, which spares the generation a round trip per round for
bookkeeping. A chain drafter hands its whole chain over in one trip (``within``): the
start, every step and the sampling between them, one hop a round rather than one a
drafted token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from backends.runtime_exchange import RuntimeExchange

T = TypeVar("T")


class RuntimeHead(Protocol):
    """A runtime's draft head of one sequence, as :class:`SequenceHead` drives it."""

    def target_decoded(self, start: int, tokens: Sequence[int], rows: Any) -> None:
        """The sequence's forward of ``tokens`` from ``start`` ran; ``rows``: its own
        (a runtime's: its rows of the captured layers, or where in the batch they are)."""
        ...

    def target_rolled_back(self, n_keep: int) -> None:
        """The sequence forgot positions from ``n_keep`` on."""
        ...

    def target_replaced(self) -> None:
        """The sequence's cache was replaced whole (MLX's; a llama.cpp head is rolled
        back to 0)."""
        ...

    def finish(self) -> None:
        """A round's drafting is over."""
        ...


# The follow-ups noted until the runtime thread next works on the head, in order.
_REPLACED = "replaced"  # the target's cache was replaced whole
_FINISHED = "finished"  # a round's drafting is over


class SequenceHead:
    """A parallel model's head, following one sequence (see the module's docstring).

    The drafters (Eagle3Drafter, BlockDrafter) call it as they call a head; its plain
    attributes (``kind``, ``max_drafts``, ``decodes``, ...) are the head's own.
    """

    def __init__(self, head: Any, exchange: RuntimeExchange) -> None:
        self.head = head
        self._exchange = exchange
        self._noted: list[int | str] = []  # rollbacks (positions kept) and the above

    def __getattr__(self, name: str) -> Any:
        # Only names not found on this object: the head's plain attributes. (Private
        # names are not read through: the head's state is worked on the runtime thread.)
        if name.startswith("_") or name == "head":
            raise AttributeError(name)
        return getattr(self.head, name)

    # -- drafting: on the runtime thread ------------------------------------------

    def start(self, evaluated: int, context: Sequence[int]) -> Any:
        """A chain head's first row (an EAGLE-3 head's ``start``), on the host."""
        return self._exchange.call(lambda: self._caught_up().start(evaluated, context))

    def step(self, token: int) -> Any:
        """A chain head's next row after ``token`` (its ``step``), on the host."""
        return self._exchange.call(lambda: self._caught_up().step(token))

    def within(self, work: Callable[[Any], T]) -> T:
        """``work(head)`` on the runtime thread, in one trip: a whole chain (its start,
        its steps and the sampling between them) costs one hop there, not one a step.
        ``work`` calls the runtime's head itself, so it must not wait on the runtime."""
        return self._exchange.call(lambda: work(self._caught_up()))

    def draft_block(self, evaluated: int, context: Sequence[int], drafts: int) -> Any:
        """A block head's rows (a DFlash head's ``draft_block``), on the host."""
        return self._exchange.call(
            lambda: self._caught_up().draft_block(evaluated, context, drafts)
        )

    def finish(self) -> None:
        """The round's drafting is over: its entries go before the head's next work."""
        self._noted.append(_FINISHED)

    # -- following the sequence -------------------------------------------------

    def target_decoded(self, start: int, tokens: Sequence[int], rows: Any) -> None:
        """The sequence's forward of ``tokens`` from ``start`` ran; ``rows``, its own
        (called by the batcher, on the runtime thread)."""
        self._caught_up().target_decoded(start, tokens, rows)

    def target_rolled_back(self, n_keep: int) -> None:
        """The sequence forgot positions from ``n_keep`` on (noted; see the module)."""
        self._noted.append(n_keep)

    def target_replaced(self) -> None:
        """The sequence's cache was replaced whole (noted; see the module)."""
        self._noted.append(_REPLACED)

    def _caught_up(self) -> RuntimeHead:
        """The head, with what was noted since its last work done (runtime thread).

        The sequence's generation thread waits meanwhile (for this call, or for the
        forward that feeds the head), so nothing is noted while the notes are read."""
        noted, self._noted = self._noted, []
        for note in noted:
            if note == _FINISHED:
                self.head.finish()
            elif note == _REPLACED:
                self.head.target_replaced()
            else:
                self.head.target_rolled_back(int(note))
        return self.head
